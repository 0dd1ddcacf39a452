//go:build integration

package integration_test

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/feedback"
)

// twilioFeedbackToken is the auth token of TestTwilioFeedback's provider:
// distinctive, so that a match anywhere is a leak.
const twilioFeedbackToken = "twilio-SECRET-6f3a"

// TestTwilioFeedback, through the built worker: a message sent through a
// twilio provider asks Twilio (a loopback fake) to POST its statuses to
// the worker's API; the delivered status, signed with the auth token over
// that URL, becomes the message's event, which GET lists, once however
// often it is POSTed; a forged status is refused; a STOP reply suppresses
// the number, so that the next message to it is archived unsent. The
// token, read from the environment, appears in no output, no metric and
// nothing in Redis.
func TestTwilioFeedback(t *testing.T) {
	t.Setenv("TWILIO_FEEDBACK_TOKEN", twilioFeedbackToken)
	var mu sync.Mutex
	var callbacks []string // the StatusCallback of each send
	twilio := newServiceFake(t, func(r *http.Request) string {
		_ = r.ParseForm()
		mu.Lock()
		callbacks = append(callbacks, r.PostForm.Get("StatusCallback"))
		mu.Unlock()
		return r.PostForm.Get("To")
	}, func(_ string, seq int) (int, map[string]string, string) {
		return http.StatusCreated, nil, fmt.Sprintf(`{"sid":"SM%d","status":"queued"}`, seq)
	})
	addr := freeAddr(t)
	f := newFleet(t, fleetConfig{Concurrency: 4, ShutdownTimeout: 5 * time.Second, Policy: "[{limit: 100, per: 1h}]", Rate: 50, Burst: 10,
		ProviderMore: fmt.Sprintf(`
  sms:
    type: twilio
    account_sid: AC1
    password: {env: TWILIO_FEEDBACK_TOKEN}
    from: "+15550001111"
    base_url: %s
    rate: 10
    burst: 10
    feedback: {public_url: "http://%s"}`, twilio.srv.URL, addr),
		API: fmt.Sprintf("\n  addr: %s\n  keys:\n    billing: {key: %s, tenant: billing}\n", addr, apiKeyBilling)}, nil)
	w := f.startWorker("w1")
	base := "http://" + addr
	const to = "+15550002222"
	sms := `{"recipient":"` + to + `","template":"otp","provider":"sms","data":{"body":"Your code is 1234"}}`
	id, _ := call(t, "POST", base+"/v1/notifications", apiKeyBilling, sms).body["id"].(string)
	var callback string
	for deadline := time.Now().Add(20 * time.Second); callback == ""; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		if len(callbacks) > 0 {
			callback = callbacks[0]
		}
		mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the message did not reach Twilio in 20s")
		}
	}
	if want := base + "/v1/feedback/sms?m=" + id; callback != want {
		t.Fatalf("StatusCallback %q, want %q", callback, want)
	}
	delivered := url.Values{"MessageSid": {"SM0"}, "MessageStatus": {"delivered"}, "To": {to}, "From": {"+15550001111"}, "AccountSid": {"AC1"}}
	for i, want := range []int{http.StatusOK, http.StatusConflict} { // the same status twice: applied once
		if got := postTwilio(t, twilioFeedbackToken, callback, delivered); got != want {
			t.Errorf("the delivered status, POST %d: %d, want %d", i+1, got, want)
		}
	}
	if got := postTwilio(t, "not-the-token", callback, delivered); got != http.StatusForbidden {
		t.Errorf("a forged status: %d, want 403", got)
	}
	events, _ := call(t, "GET", base+"/v1/notifications/"+id, apiKeyBilling, "").body["events"].([]any)
	var types []string
	for _, e := range events {
		types = append(types, fmt.Sprint(e.(map[string]any)["type"]))
	}
	if got := strings.Join(types, " "); got != "accepted sent delivered" {
		t.Errorf("the message's events: %s, want accepted sent delivered", got)
	}
	stop := url.Values{"MessageSid": {"SMreply1"}, "From": {to}, "To": {"+15550001111"}, "Body": {"STOP"}, "AccountSid": {"AC1"}}
	if got := postTwilio(t, twilioFeedbackToken, base+"/v1/feedback/sms/inbound", stop); got != http.StatusOK {
		t.Errorf("a STOP reply: %d, want 200", got)
	}
	next, _ := call(t, "POST", base+"/v1/notifications", apiKeyBilling, sms).body["id"].(string)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := call(t, "GET", base+"/v1/notifications/"+next, apiKeyBilling, "")
		if r.body["state"] == "archived" {
			if reason := fmt.Sprint(r.body["reason"]); !strings.Contains(reason, "suppressed") {
				t.Errorf("the next message archived for %q, want its suppression", reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the next message to a number that replied STOP: %v after 20s, want archived", r.body)
		}
	}
	if n := len(twilio.to(to)); n != 1 {
		t.Errorf("Twilio got %d messages to the number, want 1: none after its STOP", n)
	}
	res, err := http.Get("http://" + w.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(metrics), `throttler_feedback_reports_total{provider="sms",result="delivered"} 1`) {
		t.Errorf("/metrics does not count the delivered report")
	}
	for what, s := range map[string]string{"the worker's output": w.out.String(), "/metrics": string(metrics), "Redis": dumpRedis(t, f.rdb.(*redis.Client))} {
		if strings.Contains(s, twilioFeedbackToken) {
			t.Errorf("%s shows the auth token", what)
		}
	}
}

// postTwilio POSTs form to fullURL as Twilio does, signed with token, and
// returns the status.
func postTwilio(t *testing.T, token, fullURL string, form url.Values) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fullURL, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(feedback.TwilioSignatureHeader, base64.StdEncoding.EncodeToString(feedback.TwilioSignature(token, fullURL, form)))
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}
