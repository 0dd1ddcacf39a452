package feedback

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/lifecycle"
)

// twilioStatus is the status callback of message (its SID "SM-<message>")
// as Twilio POSTs it to the URL the send gave (TwilioCallback).
func twilioStatus(message, status, errorCode string) (uri string, form url.Values) {
	form = url.Values{"MessageSid": {"SM-" + message}, "SmsSid": {"SM-" + message}, "AccountSid": {"AC1"},
		"MessageStatus": {status}, "SmsStatus": {status}, "From": {"+15550001111"}, "To": {"+15550002222"}, "ApiVersion": {"2010-04-01"}}
	if errorCode != "" {
		form.Set("ErrorCode", errorCode)
	}
	return strings.TrimPrefix(TwilioCallback(publicURL+"/", "sms")(message), publicURL), form
}

// twilioReply is a message a recipient sends to the provider's number.
func twilioReply(sid, from, body string) url.Values {
	return url.Values{"MessageSid": {sid}, "SmsSid": {sid}, "AccountSid": {"AC1"}, "From": {from}, "To": {"+15550001111"},
		"Body": {body}, "NumMedia": {"0"}, "SmsStatus": {"received"}}
}

// twilioRequest is the POST of form to uri, signed with token over the
// public URL Twilio calls.
func twilioRequest(token, uri string, form url.Values, inbound bool) Request {
	return Request{Provider: "sms", Inbound: inbound, URI: uri, Header: twilioHeaders(token, publicURL+uri, form), Body: []byte(form.Encode())}
}

// TestTwilioStatus: delivered is recorded; undelivered with a dead
// number's code is a hard bounce that suppresses it, with another code a
// soft one; the other statuses are ignored.
func TestTwilioStatus(t *testing.T) {
	f := newFixture(t)
	for _, m := range []string{"m1", "m2", "m3"} {
		f.accepted(t, m, "billing")
	}
	for _, c := range []struct {
		message, status, code string
		want                  Result
	}{
		{"m1", "sent", "", Result{Ignored: 1}},
		{"m1", "delivered", "", Result{Applied: 1}},
		{"m2", "undelivered", "30005", Result{Applied: 1}},
		{"m3", "failed", "30003", Result{Applied: 1}},
	} {
		uri, form := twilioStatus(c.message, c.status, c.code)
		if res, err := f.receive(twilioRequest(twilioToken, uri, form, false)); err != nil || res != c.want {
			t.Errorf("%s %s: Receive = %+v, %v; want %+v", c.message, c.status, res, err, c.want)
		}
	}
	for m, want := range map[string]lifecycle.Event{
		"m1": {Type: lifecycle.Delivered, ProviderMessageID: "SM-m1"},
		"m2": {Type: lifecycle.Bounced, ProviderMessageID: "SM-m2", Reason: lifecycle.BouncedHard, Detail: "undelivered: error 30005"},
		"m3": {Type: lifecycle.Bounced, ProviderMessageID: "SM-m3", Reason: lifecycle.BouncedSoft, Detail: "failed: error 30003"},
	} {
		h := f.history(t, m)
		if len(h) != 1 {
			t.Errorf("%s's history %+v, want one event", m, h)
			continue
		}
		got := lifecycle.Event{Type: h[0].Type, ProviderMessageID: h[0].ProviderMessageID, Reason: h[0].Reason, Detail: h[0].Detail}
		if got != want || h[0].Provider != "sms" || h[0].Tenant != "billing" {
			t.Errorf("%s's event %+v, want %+v of provider sms, tenant billing", m, h[0], want)
		}
	}
	if got, want := f.suppressed(t, "sms"), map[string]string{"+15550002222": "feedback: bounced: undelivered: error 30005"}; !reflect.DeepEqual(got, want) {
		t.Errorf("suppressed %v, want %v", got, want)
	}
}

// TestTwilioStop: a reply of a stop word, in any case and with spaces
// around it, suppresses its sender for the provider, once; any other
// reply changes nothing.
func TestTwilioStop(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		sid, from, body string
		want            Result
	}{
		{"SMr1", "+15550003333", " stop\n", Result{Applied: 1}},
		{"SMr2", "+15550004444", "Unsubscribe", Result{Applied: 1}},
		{"SMr3", "+15550005555", "stop please", Result{Ignored: 1}},
		{"SMr4", "+15550005555", "START", Result{Ignored: 1}},
		{"SMr5", "+15550006666", "QUIT", Result{Applied: 1}},
	} {
		if res, err := f.receive(twilioRequest(twilioToken, "/v1/feedback/sms/inbound", twilioReply(c.sid, c.from, c.body), true)); err != nil || res != c.want {
			t.Errorf("%q: Receive = %+v, %v; want %+v", c.body, res, err, c.want)
		}
	}
	want := map[string]string{"+15550003333": "feedback: unsubscribed: replied STOP", "+15550004444": "feedback: unsubscribed: replied UNSUBSCRIBE",
		"+15550006666": "feedback: unsubscribed: replied QUIT"}
	if got := f.suppressed(t, "sms"); !reflect.DeepEqual(got, want) {
		t.Errorf("suppressed %v, want %v", got, want)
	}
	if _, err := f.receive(twilioRequest(twilioToken, "/v1/feedback/sms/inbound", twilioReply("SMr1", "+15550003333", "STOP"), true)); !errors.Is(err, ErrReplayed) {
		t.Errorf("the same reply again: %v, want ErrReplayed", err)
	}
}

// TestTwilioMistakes: a request not signed with the auth token over the
// URL Twilio called is refused and changes nothing; a status of a
// message we have no history of is ignored and counted.
func TestTwilioMistakes(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "")
	uri, form := twilioStatus("m1", "undelivered", "21610")
	otherURL := twilioRequest(twilioToken, uri, form, false)
	otherURL.Header = twilioHeaders(twilioToken, "https://internal.example.com"+uri, form)
	tampered := twilioRequest(twilioToken, uri, form, false)
	tampered.URI = "/v1/feedback/sms?m=someone-else"
	unsigned := twilioRequest(twilioToken, uri, form, false)
	unsigned.Header.Del("X-Twilio-Signature")
	formless := twilioRequest(twilioToken, uri, form, false)
	formless.Header.Set("Content-Type", "application/json")
	noStatus := url.Values{"MessageSid": {"SM1"}}
	for _, c := range []struct {
		name string
		req  Request
		want error
	}{
		{"signed with another token", twilioRequest("another-token", uri, form, false), ErrSignature},
		{"signed over another URL (public_url not what Twilio calls)", otherURL, ErrSignature},
		{"another message's URL", tampered, ErrSignature},
		{"unsigned", unsigned, ErrSignature},
		{"not a form", formless, ErrMalformed},
		{"no status", twilioRequest(twilioToken, uri, noStatus, false), ErrMalformed},
		{"a reply without its sender", twilioRequest(twilioToken, "/v1/feedback/sms/inbound", url.Values{"MessageSid": {"SM2"}, "Body": {"STOP"}}, true), ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) { f.refused(t, c.req, c.want) })
	}
	uri, form = twilioStatus("never-sent", "undelivered", "21610")
	if res, err := f.receive(twilioRequest(twilioToken, uri, form, false)); err != nil || res != (Result{Unknown: 1}) {
		t.Errorf("a status of a message not ours: %+v, %v; want 1 unknown", res, err)
	}
	if got := f.suppressed(t, "sms"); len(got) != 0 {
		t.Errorf("suppressed %v by reports that were refused or not ours", got)
	}
}
