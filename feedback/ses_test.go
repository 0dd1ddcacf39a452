package feedback

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/lifecycle"
)

// sesBounce is SES's event of a bounce of our message (a configuration
// set's event publishing: its tags carry task_id), as SES documents it.
func sesBounce(message, bounceType, address string) string {
	return fmt.Sprintf(`{"eventType":"Bounce","bounce":{"bounceType":%q,"bounceSubType":"General",
 "bouncedRecipients":[{"emailAddress":%q,"action":"failed","status":"5.1.1","diagnosticCode":"smtp; 550 5.1.1 <%s>... User unknown"}],
 "timestamp":"2025-06-10T08:00:00.000Z","feedbackId":"0100018f-feedback"},
 "mail":{"timestamp":"2025-06-10T07:59:58.000Z","source":"noreply@example.com","messageId":"0100018f-ses-%s",
 "destination":[%q],"tags":{"ses:configuration-set":["transactional"],"task_id":[%q]}}}`,
		bounceType, address, address, message, address, message)
}

// sesDelivery is SES's event of our message delivered.
func sesDelivery(message, address string) string {
	return fmt.Sprintf(`{"eventType":"Delivery","mail":{"messageId":"0100018f-ses-%s","destination":[%q],"tags":{"task_id":[%q]}},
 "delivery":{"timestamp":"2025-06-10T08:00:01.000Z","processingTimeMillis":950,"recipients":[%q],"smtpResponse":"250 2.0.0 OK","reportingMTA":"a8-1.smtp-out.amazonses.com"}}`,
		message, address, message, address)
}

// notification is an SNS notification of message on the test topic,
// signed at now with the fake SNS's certificate.
func (f *fixture) notification(t *testing.T, id, message string) snsPost {
	return snsPost{Type: "Notification", MessageID: id, TopicArn: topic, Message: message, Version: "2",
		SigningCertURL: f.sns.certURL(), At: recently()}
}

// TestSESBounceSuppresses: a hard bounce SNS brings is verified, suppresses
// its address for the provider, with the reason, and is the message's
// bounced event, in its history and on its tenant's callback; the
// certificate is fetched once, its issuer where it names it.
func TestSESBounceSuppresses(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "billing")
	f.accepted(t, "m2", "billing")
	res, err := f.receive(Request{Provider: "email", Body: f.notification(t, "sns-1", sesBounce("m1", "Permanent", "alice@example.com")).body(t, f.sns.signer.key)})
	if err != nil || res.Applied != 1 {
		t.Fatalf("Receive = %+v, %v; want 1 applied", res, err)
	}
	reason := f.suppressed(t, "email")["alice@example.com"]
	if !strings.HasPrefix(reason, "feedback: bounced: Permanent/General: 5.1.1: smtp; 550 5.1.1 <a***@example.com>") {
		t.Errorf("suppression's reason %q: want which feedback, the address redacted", reason)
	}
	events := f.history(t, "m1")
	if len(events) != 1 || events[0].Type != lifecycle.Bounced || events[0].Reason != lifecycle.BouncedHard ||
		events[0].Provider != "email" || events[0].ProviderMessageID != "0100018f-ses-m1" || events[0].Tenant != "billing" {
		t.Errorf("history %+v, want one hard bounce of provider email with SES's message ID", events)
	}
	if n := f.callbacks(t, "billing"); n != 3 { // two accepted, one bounced
		t.Errorf("billing's callbacks hold %d events, want 3", n)
	}
	// A soft bounce is the message's event, and suppresses nothing.
	if _, err := f.receive(Request{Provider: "email", Body: f.notification(t, "sns-2", sesBounce("m2", "Transient", "bob@example.com")).body(t, f.sns.signer.key)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.suppressed(t, "email")["bob@example.com"]; ok {
		t.Error("a soft bounce suppressed its address")
	}
	if h := f.history(t, "m2"); len(h) != 1 || h[0].Reason != lifecycle.BouncedSoft {
		t.Errorf("m2's history %+v, want a soft bounce", h)
	}
	if _, gets := f.sns.confirmations(); gets != 1 {
		t.Errorf("the signing certificate was fetched %d times, want once", gets)
	}
}

// TestSESSignatureVersions: SNS's SignatureVersion 1 (SHA1withRSA) and 2
// (SHA256withRSA) both verify; a delivery is recorded, a complaint
// suppresses, an event none of ours is ignored.
func TestSESSignatureVersions(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "")
	subject := "Amazon SES Email Event Notification"
	for i, c := range []struct {
		version, message string
		subject          *string
		want             Result
	}{
		{"1", sesDelivery("m1", "carol@example.com"), nil, Result{Applied: 1}},
		{"2", `{"eventType":"Complaint","complaint":{"complainedRecipients":[{"emailAddress":"carol@example.com"}],"complaintFeedbackType":"abuse"},"mail":{"messageId":"0100018f-ses-m1","tags":{"task_id":["m1"]}}}`,
			&subject, Result{Applied: 1}},
		{"1", `{"eventType":"Open","open":{},"mail":{"messageId":"0100018f-ses-m1","tags":{"task_id":["m1"]}}}`, &subject, Result{Ignored: 1}},
	} {
		p := f.notification(t, fmt.Sprintf("sns-%d", i), c.message)
		p.Version, p.Subject = c.version, c.subject
		if res, err := f.receive(Request{Provider: "email", Body: p.body(t, f.sns.signer.key)}); err != nil || res != c.want {
			t.Errorf("version %s, %.40s: Receive = %+v, %v; want %+v", c.version, c.message, res, err, c.want)
		}
	}
	if got, want := f.types(t, "m1"), []lifecycle.Type{lifecycle.Delivered, lifecycle.Complained}; !slices.Equal(got, want) {
		t.Errorf("history %v, want %v", got, want)
	}
	if reason := f.suppressed(t, "email")["carol@example.com"]; reason != "feedback: complained: abuse" {
		t.Errorf("suppression %q, want the complaint", reason)
	}
}

// TestSNSSubscriptionConfirmed: a verified SubscriptionConfirmation of a
// configured topic is confirmed by GETting its SubscribeURL; one of
// another topic, or forged, is refused and nothing is GETted.
func TestSNSSubscriptionConfirmed(t *testing.T) {
	f := newFixture(t)
	confirmation := func(topicARN, token string) snsPost {
		return snsPost{Type: "SubscriptionConfirmation", MessageID: "sub-" + token, TopicArn: topicARN, Token: token, Version: "2", At: recently(),
			Message:        "You have chosen to subscribe to the topic " + topicARN + ".\nTo confirm the subscription, visit the SubscribeURL included in this message.",
			SubscribeURL:   "https://" + f.sns.host + "/?Action=ConfirmSubscription&TopicArn=" + topicARN + "&Token=" + token,
			SigningCertURL: f.sns.certURL()}
	}
	res, err := f.receive(Request{Provider: "email", Body: confirmation(topic, "tok-1").body(t, f.sns.signer.key)})
	if err != nil || !res.Confirmed {
		t.Fatalf("Receive = %+v, %v; want the subscription confirmed", res, err)
	}
	other := "arn:aws:sns:eu-west-1:123456789012:someone-elses"
	if _, err := f.receive(Request{Provider: "email", Body: confirmation(other, "tok-2").body(t, f.sns.signer.key)}); !errors.Is(err, ErrSignature) {
		t.Errorf("another topic's confirmation: %v, want ErrSignature", err)
	}
	forged := confirmation(topic, "tok-3")
	if _, err := f.receive(Request{Provider: "email", Body: forged.body(t, rsaKey(t))}); !errors.Is(err, ErrSignature) {
		t.Errorf("a forged confirmation: %v, want ErrSignature", err)
	}
	if tokens, _ := f.sns.confirmations(); !reflect.DeepEqual(tokens, []string{"tok-1"}) {
		t.Errorf("confirmed %v, want only tok-1", tokens)
	}
}

// TestSNSMistakes: a request SNS did not sign as documented is refused,
// each for what it is, and changes nothing; so is a body that is not an
// SNS message, and a replay of one applied.
func TestSNSMistakes(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "billing")
	good := f.notification(t, "sns-1", sesBounce("m1", "Permanent", "alice@example.com"))
	sign := func(p snsPost) []byte { return p.body(t, f.sns.signer.key) }
	tampered := func() []byte {
		return []byte(strings.Replace(string(sign(good)), "Permanent", "Transient", 1))
	}
	with := func(change func(*snsPost)) []byte {
		p := good
		change(&p)
		return sign(p)
	}
	for _, c := range []struct {
		name string
		body []byte
		want error
	}{
		{"tampered after signing", tampered(), ErrSignature},
		{"signed with another key", good.body(t, rsaKey(t)), ErrSignature},
		{"unsigned", []byte(strings.Replace(string(sign(good)), `"Signature":"`, `"Signature":"x`, 1)), ErrSignature},
		{"an unknown signature version", with(func(p *snsPost) { p.Version = "3" }), ErrSignature},
		{"certificate over http", with(func(p *snsPost) { p.SigningCertURL = strings.Replace(p.SigningCertURL, "https", "http", 1) }), ErrSignature},
		{"certificate from another host", with(func(p *snsPost) { p.SigningCertURL = "https://sns.attacker.example/cert.pem" }), ErrSignature},
		{"no certificate at the URL", with(func(p *snsPost) { p.SigningCertURL = "https://" + f.sns.host + "/missing.pem" }), ErrSignature},
		{"certificate not in the trust store", func() []byte {
			p := good
			p.SigningCertURL = "https://" + f.sns.host + "/foreign.pem"
			return p.body(t, f.sns.foreign.key)
		}(), ErrSignature},
		{"stale timestamp", with(func(p *snsPost) { p.At = time.Now().Add(-2 * time.Hour) }), ErrSignature},
		{"a topic not configured", with(func(p *snsPost) { p.TopicArn = "arn:aws:sns:eu-west-1:123456789012:other" }), ErrSignature},
		{"not JSON", []byte("Type=Notification"), ErrMalformed},
		{"not an SES event", with(func(p *snsPost) { p.Message = "hello" }), ErrMalformed},
		{"a bounce without its object", with(func(p *snsPost) { p.Message = `{"eventType":"Bounce","mail":{}}` }), ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) { f.refused(t, Request{Provider: "email", Body: c.body}, c.want) })
	}
	if _, err := f.receive(Request{Provider: "email", Body: sign(good)}); err != nil {
		t.Fatal(err)
	}
	f.refused(t, Request{Provider: "email", Body: sign(good)}, ErrReplayed)                  // the same notification again
	f.refused(t, Request{Provider: "email", Inbound: true, Body: sign(good)}, ErrNoProvider) // replies: twilio's alone
}

// TestSNSCertificateHostOfTheTopicsRegion: by default the signing
// certificate must come from SNS's host in the topic's region.
func TestSNSCertificateHostOfTheTopicsRegion(t *testing.T) {
	ep := &snsEndpoint{certHost: "sns.{region}.amazonaws.com"}
	for url, ok := range map[string]bool{
		"https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem":      true,
		"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem":      false,
		"https://sns.eu-west-1.amazonaws.com.evil.example/x.pem":                     false,
		"https://user@sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem": false,
		"http://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem":       false,
	} {
		if err := ep.onHost(url, "eu-west-1", "SigningCertURL"); (err == nil) != ok {
			t.Errorf("%s: %v, want ok %v", url, err, ok)
		}
	}
}

// TestSESUnknownMessage: a report naming a message we have no history of,
// or none (an identity's notification, without tags), is ignored,
// counted, and changes nothing: SNS is not made to retry it.
func TestSESUnknownMessage(t *testing.T) {
	f := newFixture(t)
	before := f.snapshot(t)
	untagged := `{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","bouncedRecipients":[{"emailAddress":"dan@example.com"}]},"mail":{"messageId":"x"}}`
	for i, msg := range []string{sesBounce("never-sent", "Permanent", "dan@example.com"), untagged} {
		res, err := f.receive(Request{Provider: "email", Body: f.notification(t, fmt.Sprintf("sns-%d", i), msg).body(t, f.sns.signer.key)})
		if err != nil || res != (Result{Unknown: 1}) {
			t.Errorf("Receive = %+v, %v; want 1 unknown", res, err)
		}
	}
	after := f.snapshot(t)
	for k := range after {
		if _, ok := before[k]; !ok && !strings.HasPrefix(k, "throttle:feedback:{") {
			t.Errorf("an unknown message's report wrote %s", k)
		}
	}
}

// TestSNSCertificateUnreachable: a signing certificate that cannot be
// fetched (SNS's host does not answer) is not the request's fault: the
// error is not a refusal, so the API answers 503 and SNS retries; nothing
// is applied meanwhile.
func TestSNSCertificateUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	f := newFixture(t, func(cfg *config.Config) {
		p := cfg.Providers["email"]
		p.Feedback.CertHost = down
		cfg.Providers["email"] = p
	})
	f.accepted(t, "m1", "")
	p := f.notification(t, "sns-1", sesBounce("m1", "Permanent", "alice@example.com"))
	p.SigningCertURL = "https://" + down + "/SimpleNotificationService-test.pem"
	before := f.snapshot(t)
	_, err = f.receive(Request{Provider: "email", Body: p.body(t, f.sns.signer.key)})
	if err == nil || errors.Is(err, ErrSignature) || errors.Is(err, ErrMalformed) {
		t.Errorf("Receive: %v, want an error that is no refusal", err)
	}
	if after := f.snapshot(t); !reflect.DeepEqual(before, after) {
		t.Error("a request whose certificate could not be fetched changed Redis")
	}
}
