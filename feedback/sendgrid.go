package feedback

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// The headers of SendGrid's signed Event Webhook.
const (
	SendGridSignatureHeader = "X-Twilio-Email-Event-Webhook-Signature"
	SendGridTimestampHeader = "X-Twilio-Email-Event-Webhook-Timestamp"
)

// sendgridEndpoint reads a SendGrid provider's Event Webhook: a JSON array
// of events, signed with ECDSA P-256 (SHA-256, ASN.1 DER in base64) over the
// timestamp header followed by the body as sent.
type sendgridEndpoint struct {
	provider  string
	key       *ecdsa.PublicKey
	tolerance time.Duration
}

// sendgridEvent is one event of the webhook; custom_args, task_id among
// them, come as members of their own.
type sendgridEvent struct {
	Event      string `json:"event"`
	Email      string `json:"email"`
	MessageID  string `json:"sg_message_id"`
	TaskID     string `json:"task_id"`
	Type       string `json:"type"`   // bounce: "bounce" or "blocked"
	Reason     string `json:"reason"` // bounce, dropped
	Status     string `json:"status"` // bounce: the SMTP status
	Response   string `json:"response"`
	ASMGroupID any    `json:"asm_group_id"`
}

func (e *sendgridEndpoint) read(_ context.Context, req Request) (reading, error) {
	sig, ts := req.Header.Get(SendGridSignatureHeader), req.Header.Get(SendGridTimestampHeader)
	if sig == "" || ts == "" {
		return reading{}, fmt.Errorf("%w: unsigned: no %s and %s headers", ErrSignature, SendGridSignatureHeader, SendGridTimestampHeader)
	}
	der, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return reading{}, fmt.Errorf("%w: %s is not base64", ErrSignature, SendGridSignatureHeader)
	}
	h := sha256.New()
	h.Write([]byte(ts))
	h.Write(req.Body)
	if !ecdsa.VerifyASN1(e.key, h.Sum(nil), der) {
		return reading{}, fmt.Errorf("%w: the signature does not verify with providers.%s.feedback.verification_key", ErrSignature, e.provider)
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return reading{}, fmt.Errorf("%w: %s %q is not Unix seconds", ErrSignature, SendGridTimestampHeader, ts)
	}
	if err := fresh(time.Unix(unix, 0), time.Now(), e.tolerance); err != nil {
		return reading{}, err
	}
	var events []sendgridEvent
	if err := json.Unmarshal(req.Body, &events); err != nil {
		return reading{}, fmt.Errorf("%w: not a JSON array of SendGrid events: %v", ErrMalformed, err)
	}
	var rd reading
	for _, ev := range events {
		if r, ok := ev.report(); ok {
			rd.reports = append(rd.reports, r)
		} else {
			rd.ignored++
		}
	}
	return rd, nil
}

// report returns ev's report, or false for an event none of ours to apply
// (processed, deferred, open, click, group_resubscribe).
func (ev sendgridEvent) report() (Report, bool) {
	// sg_message_id is the send's X-Message-Id, a dot, then SendGrid's own.
	pmid, _, _ := strings.Cut(ev.MessageID, ".")
	r := Report{Message: ev.TaskID, ProviderMessageID: pmid, Address: ev.Email}
	switch ev.Event {
	case "delivered":
		r.Type, r.Detail = lifecycle.Delivered, words(ev.Email, ev.Response)
	case "bounce":
		r.Type, r.Reason = lifecycle.Bounced, lifecycle.BouncedHard
		if ev.Type == "blocked" { // the receiving server refused it for now
			r.Reason = lifecycle.BouncedSoft
		}
		r.Detail = words(ev.Email, ev.Type, ev.Status, ev.Reason)
	case "dropped":
		r.Type, r.Reason, r.Detail = lifecycle.Bounced, lifecycle.BouncedSoft, words(ev.Email, "dropped", ev.Reason)
		if deadAddress(ev.Reason) {
			r.Reason = lifecycle.BouncedHard
		}
	case "spamreport":
		r.Type, r.Detail = lifecycle.Complained, "spamreport"
	case "unsubscribe":
		r.Type, r.Detail = lifecycle.Unsubscribed, "unsubscribe"
	case "group_unsubscribe":
		r.Type, r.Detail = lifecycle.Unsubscribed, fmt.Sprintf("group_unsubscribe: group %v", ev.ASMGroupID)
	default:
		return Report{}, false
	}
	return r, true
}

// deadAddress reports whether SendGrid dropped a message for its address
// (on one of its lists, or "Invalid") rather than for the message ("Invalid
// SMTPAPI header", "Spam Content", a quota).
func deadAddress(reason string) bool {
	lists := []string{"Bounced Address", "Unsubscribed Address", "Spam Reporting Address"}
	return slices.ContainsFunc(lists, func(s string) bool { return strings.Contains(reason, s) }) ||
		strings.TrimSpace(reason) == "Invalid"
}
