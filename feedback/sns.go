package feedback

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/internal/timefmt"
)

// snsMessage is what SNS POSTs to a subscriber: a subscription's
// confirmation, a notification (Message: SES's event) or an unsubscribe's
// confirmation. Subject is a pointer: a notification signs it only if
// present.
type snsMessage struct {
	Type             string  `json:"Type"`
	MessageID        string  `json:"MessageId"`
	Token            string  `json:"Token"`
	TopicArn         string  `json:"TopicArn"`
	Subject          *string `json:"Subject"`
	Message          string  `json:"Message"`
	Timestamp        string  `json:"Timestamp"`
	SignatureVersion string  `json:"SignatureVersion"`
	Signature        string  `json:"Signature"`
	SigningCertURL   string  `json:"SigningCertURL"`
	SubscribeURL     string  `json:"SubscribeURL"`
}

const (
	snsConfirmation   = "SubscriptionConfirmation"
	snsNotification   = "Notification"
	snsUnsubscription = "UnsubscribeConfirmation"
)

// stringToSign is what SNS signs, as AWS documents it: the signed fields in
// byte order of their names, each as "name\nvalue\n". A notification signs
// Subject (if present), the confirmations SubscribeURL and Token instead.
func (m *snsMessage) stringToSign() []byte {
	var b strings.Builder
	add := func(name, value string) { b.WriteString(name + "\n" + value + "\n") }
	add("Message", m.Message)
	add("MessageId", m.MessageID)
	if m.Type == snsNotification {
		if m.Subject != nil {
			add("Subject", *m.Subject)
		}
	} else {
		add("SubscribeURL", m.SubscribeURL)
	}
	add("Timestamp", m.Timestamp)
	if m.Type != snsNotification {
		add("Token", m.Token)
	}
	add("TopicArn", m.TopicArn)
	add("Type", m.Type)
	return []byte(b.String())
}

// snsEndpoint reads an SES provider's events from the SNS topics it
// publishes them to.
type snsEndpoint struct {
	provider  string
	topics    map[string]string // the configured topics' ARNs, to their regions
	certHost  string            // the signing certificates' host, "{region}" the topic's
	tolerance time.Duration
	certs     *certs
	log       *slog.Logger
}

func (e *snsEndpoint) read(ctx context.Context, req Request) (reading, error) {
	var m snsMessage
	if err := json.Unmarshal(req.Body, &m); err != nil || m.Type == "" || m.MessageID == "" || m.TopicArn == "" {
		return reading{}, fmt.Errorf("%w: not an SNS message (a JSON object with Type, MessageId and TopicArn)", ErrMalformed)
	}
	region, ok := e.topics[m.TopicArn]
	if !ok {
		return reading{}, fmt.Errorf("%w: topic %s is not one of providers.%s.feedback.topic_arns", ErrSignature, m.TopicArn, e.provider)
	}
	if err := e.verify(ctx, &m, region); err != nil {
		return reading{}, err
	}
	switch m.Type {
	case snsConfirmation:
		return reading{confirmed: true}, e.confirm(ctx, &m, region)
	case snsUnsubscription:
		e.log.Warn("feedback: SNS says the subscription to a topic was removed: no more reports come from it",
			"provider", e.provider, "topic", m.TopicArn)
		return reading{}, nil
	case snsNotification:
		return sesEvent(m.Message)
	}
	return reading{}, fmt.Errorf("%w: SNS message type %q", ErrMalformed, m.Type)
}

// verify checks m's signature with the certificate it names (https on the
// region's SNS host, chained to the trust store), and its time.
func (e *snsEndpoint) verify(ctx context.Context, m *snsMessage, region string) error {
	var hash crypto.Hash
	var digest []byte
	switch m.SignatureVersion {
	case "1":
		sum := sha1.Sum(m.stringToSign())
		hash, digest = crypto.SHA1, sum[:]
	case "2":
		sum := sha256.Sum256(m.stringToSign())
		hash, digest = crypto.SHA256, sum[:]
	default:
		return fmt.Errorf("%w: SignatureVersion %q: want 1 or 2", ErrSignature, m.SignatureVersion)
	}
	sig, err := base64.StdEncoding.DecodeString(m.Signature)
	if err != nil || len(sig) == 0 {
		return fmt.Errorf("%w: no base64 Signature", ErrSignature)
	}
	if err := e.onHost(m.SigningCertURL, region, "SigningCertURL"); err != nil {
		return err
	}
	cert, err := e.certs.get(ctx, m.SigningCertURL)
	if err != nil {
		return err
	}
	pub, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the signing certificate's key is not RSA", ErrSignature)
	}
	if rsa.VerifyPKCS1v15(pub, hash, digest, sig) != nil {
		return fmt.Errorf("%w: the signature does not verify with the certificate at %s", ErrSignature, m.SigningCertURL)
	}
	at, err := time.Parse(time.RFC3339Nano, m.Timestamp)
	if err != nil {
		return fmt.Errorf("%w: Timestamp %q is not an RFC 3339 time", ErrMalformed, m.Timestamp)
	}
	return fresh(at, time.Now(), e.tolerance)
}

// onHost checks that a URL SNS gives is https on the region's SNS host.
func (e *snsEndpoint) onHost(raw, region, what string) error {
	want := strings.ReplaceAll(e.certHost, "{region}", region)
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host != want || u.User != nil {
		return fmt.Errorf("%w: %s %q is not on https://%s", ErrSignature, what, raw, want)
	}
	return nil
}

// confirm confirms a verified subscription by GETting its SubscribeURL.
func (e *snsEndpoint) confirm(ctx context.Context, m *snsMessage, region string) error {
	if err := e.onHost(m.SubscribeURL, region, "SubscribeURL"); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.SubscribeURL, nil)
	if err != nil {
		return fmt.Errorf("%w: SubscribeURL: %v", ErrMalformed, err)
	}
	res, err := e.certs.client.Do(req)
	if err != nil {
		return fmt.Errorf("feedback: confirming the subscription to %s: %w", m.TopicArn, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("feedback: confirming the subscription to %s: SNS answered %s", m.TopicArn, res.Status)
	}
	e.log.Info("feedback: SNS subscription confirmed", "provider", e.provider, "topic", m.TopicArn)
	return nil
}

// fresh checks that a request signed at at is within tolerance of now.
func fresh(at, now time.Time, tolerance time.Duration) error {
	if off := now.Sub(at); off > tolerance || off < -tolerance {
		return fmt.Errorf("%w: signed at %s, %s from now: outside the tolerance of %s (a replay, or a clock far off)",
			ErrSignature, at.UTC().Format(time.RFC3339), timefmt.Duration(off.Round(time.Second)), timefmt.Duration(tolerance))
	}
	return nil
}
