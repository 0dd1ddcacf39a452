package api

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/feedback"
)

// smsToken is the auth token of the tests' twilio provider.
const smsToken = "twilio-auth-token-0123456789"

// withFeedback gives the tests' config a sendgrid provider ("email")
// whose Event Webhook key is key's, and a twilio provider ("text") whose
// feedback the API reads.
func withFeedback(key *ecdsa.PrivateKey) func(*config.Config) {
	return func(cfg *config.Config) {
		der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
		cfg.Providers["email"] = config.Provider{Type: config.ProviderSendGrid, Rate: 10, Burst: 10, Timeout: time.Second, APIKey: "k", From: "noreply@example.com",
			Feedback: config.Feedback{Enabled: true, VerificationKey: config.Secret(base64.StdEncoding.EncodeToString(der))}}
		cfg.Providers["text"] = config.Provider{Type: config.ProviderTwilio, Rate: 10, Burst: 10, Timeout: time.Second, AccountSID: "AC1", Password: smsToken,
			From: "+15550001111", Feedback: config.Feedback{Enabled: true, PublicURL: "https://api.example.com"}}
		cfg.Providers["hook"] = config.Provider{Type: config.ProviderLog, Rate: 10, Burst: 10, Output: os.DevNull}
	}
}

// sendgridPost POSTs events to the sendgrid provider's feedback, signed
// with key at at.
func (f *fixture) sendgridPost(key *ecdsa.PrivateKey, at time.Time, events string) response {
	f.t.Helper()
	ts := strconv.FormatInt(at.Unix(), 10)
	sum := sha256.Sum256([]byte(ts + events))
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		f.t.Fatal(err)
	}
	return f.do(http.MethodPost, "/v1/feedback/email", "", events, feedback.SendGridSignatureHeader, base64.StdEncoding.EncodeToString(sig),
		feedback.SendGridTimestampHeader, ts)
}

// TestFeedbackThroughTheAPI: a provider's signed report, without an API
// key, becomes the message's event, which GET lists; a forged one is a
// 403, the same report again a 409, an unknown provider a 404, a body
// that is not the vendor's a 400, one too large a 413.
func TestFeedbackThroughTheAPI(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, withFeedback(key))
	id := f.post(billingKey, `{"recipient":"alice@example.com","template":"welcome","provider":"email","data":{"subject":"Hi","body":"Hello"}}`).body["id"].(string)
	delivered := fmt.Sprintf(`[{"email":"alice@example.com","event":"delivered","sg_event_id":"e1","sg_message_id":"x1.filter","task_id":%q}]`, id)
	r := f.sendgridPost(key, time.Now(), delivered)
	if r.status != http.StatusOK || r.body["applied"] != 1.0 {
		t.Fatalf("feedback = %d %v, want 200 and 1 applied", r.status, r.body)
	}
	got := f.do(http.MethodGet, "/v1/notifications/"+id, billingKey, "")
	events, _ := got.body["events"].([]any)
	if last, _ := events[len(events)-1].(map[string]any); last["type"] != "delivered" || last["provider"] != "email" || last["provider_message_id"] != "x1" {
		t.Errorf("GET's events %v, want the delivered event last", events)
	}
	stranger, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, c := range []struct {
		name   string
		r      response
		status int
		code   string
	}{
		{"forged", f.sendgridPost(stranger, time.Now(), delivered), http.StatusForbidden, CodeBadSignature},
		{"stale", f.sendgridPost(key, time.Now().Add(-time.Hour), delivered), http.StatusForbidden, CodeBadSignature},
		{"unsigned", f.do(http.MethodPost, "/v1/feedback/email", "", delivered), http.StatusForbidden, CodeBadSignature},
		{"replayed", f.sendgridPost(key, time.Now(), delivered), http.StatusConflict, CodeReplayed},
		{"malformed", f.sendgridPost(key, time.Now(), `{"event":"delivered"}`), http.StatusBadRequest, CodeInvalid},
		{"no such provider", f.do(http.MethodPost, "/v1/feedback/nobody", "", delivered), http.StatusNotFound, CodeNotFound},
		{"a provider whose feedback is not read", f.do(http.MethodPost, "/v1/feedback/hook", "", delivered), http.StatusNotFound, CodeNotFound},
		{"too large", f.do(http.MethodPost, "/v1/feedback/email", "", strings.Repeat(" ", MaxFeedbackBody+1)), http.StatusRequestEntityTooLarge, CodeTooLarge},
	} {
		if code, _ := c.r.errorOf(t); c.r.status != c.status || code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, c.r.status, code, c.status, c.code)
		}
	}
	if r := f.do(http.MethodGet, "/v1/feedback/email", "", ""); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET of the feedback: %d, want 405", r.status)
	}
}

// TestRepliesThroughTheAPI: a STOP to a twilio provider's number,
// signed over the public URL Twilio calls, suppresses its sender and is
// answered with empty TwiML; the same reply to an email provider's is a
// 404.
func TestRepliesThroughTheAPI(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f := newFixture(t, withFeedback(key))
	form := url.Values{"MessageSid": {"SM1"}, "From": {"+15550002222"}, "To": {"+15550001111"}, "Body": {"Stop"}}
	post := func(path string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(feedback.TwilioSignatureHeader, base64.StdEncoding.EncodeToString(feedback.TwilioSignature(smsToken, "https://api.example.com"+path, form)))
		res, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		checkListed(t, http.MethodPost, path, res.StatusCode)
		checkHeaders(t, path, res, false)
		return res, string(body)
	}
	res, body := post("/v1/feedback/text/inbound")
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/xml" || body != emptyTwiML {
		t.Errorf("a STOP: %d %s %q, want 200 and empty TwiML", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	if reason := f.rdb.HGet(t.Context(), "throttle:suppressed:{text}", "+15550002222").Val(); !strings.Contains(reason, "replied STOP") {
		t.Errorf("the sender's suppression %q, want one for its STOP", reason)
	}
	if res, _ := post("/v1/feedback/email/inbound"); res.StatusCode != http.StatusNotFound {
		t.Errorf("a reply to a sendgrid provider: %d, want 404", res.StatusCode)
	}
}
