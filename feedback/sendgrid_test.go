package feedback

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// sendgridBatch is a POST of the Event Webhook: its events, as SendGrid
// documents them (custom_args as members of their own).
func sendgridBatch(events ...string) []byte {
	b := []byte("[")
	for i, e := range events {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e...)
	}
	return append(b, ']')
}

// sgEvent is one event of type event on message (its X-Message-Id
// "xmsg-<message>"), with the members more.
func sgEvent(event, message, email, more string) string {
	s := fmt.Sprintf(`{"email":%q,"timestamp":1718006400,"event":%q,"sg_event_id":"ev-%s-%s","sg_message_id":"xmsg-%s.filterdrecv-5645d9c87f-6r2ch-1-66672F90-3.0","task_id":%q`,
		email, event, event, message, message, message)
	if more != "" {
		s += "," + more
	}
	return s + "}"
}

func (f *fixture) sendgrid(t *testing.T, at time.Time, body []byte) Request {
	return Request{Provider: "grid", Header: f.grid.headers(t, at, body), Body: body}
}

// TestSendGridDeliveredOnce: a delivered event is recorded once, with
// SendGrid's message ID as the send reported it, even when SendGrid
// POSTs it twice (it sends some events twice, and retries a batch,
// signing each POST anew): the second changes nothing.
func TestSendGridDeliveredOnce(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "billing")
	delivered := sendgridBatch(sgEvent("delivered", "m1", "alice@example.com", `"response":"250 OK"`))
	if res, err := f.receive(f.sendgrid(t, recently(), delivered)); err != nil || res.Applied != 1 {
		t.Fatalf("Receive = %+v, %v; want 1 applied", res, err)
	}
	before := f.snapshot(t)
	again := sendgridBatch(sgEvent("delivered", "m1", "alice@example.com", `"response":"250 OK"`), sgEvent("open", "m1", "alice@example.com", ""))
	res, err := f.receive(f.sendgrid(t, time.Now(), again))
	if !errors.Is(err, ErrReplayed) || res.Replayed != 1 {
		t.Errorf("the same event POSTed again: %+v, %v; want it replayed", res, err)
	}
	if after := f.snapshot(t); !reflect.DeepEqual(before, after) {
		t.Error("the second POST changed Redis")
	}
	h := f.history(t, "m1")
	if len(h) != 1 || h[0].Type != lifecycle.Delivered || h[0].ProviderMessageID != "xmsg-m1" || h[0].Detail != "250 OK" {
		t.Errorf("history %+v, want one delivered event with the X-Message-Id", h)
	}
	if n := f.callbacks(t, "billing"); n != 2 {
		t.Errorf("billing's callbacks hold %d events, want 2: accepted, delivered once", n)
	}
}

// TestSendGridEvents: each event SendGrid documents does what
// docs/providers.md says: a bounce (not a block) and a drop for the
// address suppress it, as do spam reports and unsubscribes; the rest is
// ignored; an event without our task_id is unknown.
func TestSendGridEvents(t *testing.T) {
	f := newFixture(t)
	for _, m := range []string{"m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"} {
		f.accepted(t, m, "")
	}
	batch := sendgridBatch(
		sgEvent("bounce", "m1", "a@example.com", `"type":"bounce","status":"5.1.1","reason":"550 5.1.1 a@example.com does not exist"`),
		sgEvent("bounce", "m2", "b@example.com", `"type":"blocked","status":"4.0.0","reason":"421 try later"`),
		sgEvent("dropped", "m3", "c@example.com", `"reason":"Bounced Address"`),
		sgEvent("dropped", "m4", "d@example.com", `"reason":"Spam Content (if spam checker app enabled)"`),
		sgEvent("spamreport", "m5", "e@example.com", ""),
		sgEvent("unsubscribe", "m6", "f@example.com", ""),
		sgEvent("group_unsubscribe", "m7", "g@example.com", `"asm_group_id":42`),
		sgEvent("processed", "m8", "h@example.com", ""),
		sgEvent("deferred", "m8", "h@example.com", `"response":"400 try again"`),
		sgEvent("click", "m8", "h@example.com", `"url":"https://example.com"`),
		`{"email":"i@example.com","timestamp":1718006400,"event":"delivered","sg_event_id":"x","sg_message_id":"other.filter"}`,
	)
	res, err := f.receive(f.sendgrid(t, recently(), batch))
	if want := (Result{Applied: 7, Ignored: 3, Unknown: 1}); err != nil || res != want {
		t.Fatalf("Receive = %+v, %v; want %+v", res, err, want)
	}
	want := map[string]string{
		"a@example.com": "feedback: bounced: bounce: 5.1.1: 550 5.1.1 a***@example.com does not exist",
		"c@example.com": "feedback: bounced: dropped: Bounced Address",
		"e@example.com": "feedback: complained: spamreport",
		"f@example.com": "feedback: unsubscribed: unsubscribe",
		"g@example.com": "feedback: unsubscribed: group_unsubscribe: group 42",
	}
	if got := f.suppressed(t, "grid"); !reflect.DeepEqual(got, want) {
		t.Errorf("suppressed\n got %v\nwant %v", got, want)
	}
	for m, want := range map[string]string{"m1": "bounced hard", "m2": "bounced soft", "m3": "bounced hard", "m4": "bounced soft",
		"m5": "complained ", "m6": "unsubscribed ", "m7": "unsubscribed ", "m8": ""} {
		var got []string
		for _, e := range f.history(t, m) {
			got = append(got, string(e.Type)+" "+e.Reason)
		}
		if want == "" && len(got) > 0 || want != "" && !slices.Equal(got, []string{want}) {
			t.Errorf("%s's history %v, want %q", m, got, want)
		}
	}
}

// TestSendGridMistakes: a POST SendGrid did not sign with the configured
// key, or signed too long ago, is refused and changes nothing; a body
// that is not a JSON array of events too, once verified.
func TestSendGridMistakes(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "")
	body := sendgridBatch(sgEvent("bounce", "m1", "a@example.com", `"type":"bounce"`))
	stranger := newSendGridSigner(t)
	unsigned := f.sendgrid(t, recently(), body)
	unsigned.Header.Del("X-Twilio-Email-Event-Webhook-Signature")
	tampered := f.sendgrid(t, recently(), body)
	tampered.Body = sendgridBatch(sgEvent("bounce", "m1", "b@example.com", `"type":"bounce"`))
	retimed := f.sendgrid(t, recently(), body)
	retimed.Header.Set("X-Twilio-Email-Event-Webhook-Timestamp", fmt.Sprint(time.Now().Unix()+1))
	for _, c := range []struct {
		name string
		req  Request
		want error
	}{
		{"signed with another key", Request{Provider: "grid", Header: stranger.headers(t, recently(), body), Body: body}, ErrSignature},
		{"unsigned", unsigned, ErrSignature},
		{"the body changed after signing", tampered, ErrSignature},
		{"the timestamp changed after signing", retimed, ErrSignature},
		{"stale timestamp", f.sendgrid(t, time.Now().Add(-10*time.Minute), body), ErrSignature},
		{"a timestamp ahead", f.sendgrid(t, time.Now().Add(10*time.Minute), body), ErrSignature},
		{"malformed body", f.sendgrid(t, recently(), []byte(`{"event":"bounce"}`)), ErrMalformed},
		{"a provider not configured", Request{Provider: "push", Header: http.Header{}, Body: body}, ErrNoProvider},
	} {
		t.Run(c.name, func(t *testing.T) { f.refused(t, c.req, c.want) })
	}
	replayed := f.sendgrid(t, recently(), body)
	if _, err := f.receive(replayed); err != nil {
		t.Fatal(err)
	}
	f.refused(t, replayed, ErrReplayed) // the same request again
}
