// Package feedback reads what the providers report about the messages they
// accepted, on the API's listener (package api mounts it at
// /v1/feedback/<provider>): SES through SNS (sns.go, ses.go), SendGrid's
// Event Webhook (sendgrid.go), Twilio's status callbacks and inbound
// replies (twilio.go). Each request is verified first, with the vendor's
// own signature, and refused with nothing changed if it is unsigned,
// forged or stale (ErrSignature); each event it carries is then applied
// once (apply.go): a hard bounce, a complaint, an unsubscribe or a STOP
// suppresses the address for its provider (jobs.Screen, lifted by
// enqueue -unsuppress), and delivered, bounced, complained and
// unsubscribed become events of the message (package lifecycle), in its
// history and on its tenant's callback.
//
// A report names our message by the ID we sent along with it (SES's
// message tag task_id, SendGrid's custom_args.task_id, the m parameter of
// Twilio's per-message status callback URL): nothing is written on the
// send path to find it again. docs/providers.md says what each provider's
// reports do; docs/operations.md how to point each service here.
package feedback

import (
	"errors"

	"github.com/notify-throttle/throttler/lifecycle"
)

// Path is where the API serves the providers' feedback: Path + the
// provider's name, and + "/inbound" for the replies to a Twilio number.
const Path = "/v1/feedback/"

// Report is one thing a provider reports, read from its request.
type Report struct {
	// Type is what it reports: lifecycle.Delivered, Bounced, Complained
	// or Unsubscribed.
	Type lifecycle.Type
	// Message is our message's ID, as the provider carried it along; ""
	// for a report of an address alone (a STOP reply).
	Message string
	// ProviderMessageID is the provider's own ID of the message.
	ProviderMessageID string
	// Address is the recipient the provider names, which a suppression
	// is of.
	Address string
	// Reason, of a bounce, is lifecycle.BouncedHard or BouncedSoft.
	Reason string
	// Detail is the provider's words, the address in them redacted.
	Detail string
	// Vendor, of a report of an address alone, is the provider's own ID of
	// what it reports (a reply's SID): it is applied once by it.
	Vendor string
}

// suppresses reports whether r makes its address dead for its provider:
// a hard bounce, a complaint, an unsubscribe.
func (r Report) suppresses() bool {
	return r.Type == lifecycle.Bounced && r.Reason == lifecycle.BouncedHard ||
		r.Type == lifecycle.Complained || r.Type == lifecycle.Unsubscribed
}

// Result is what a request's reports did.
type Result struct {
	Applied  int `json:"applied"`  // reports applied now
	Unknown  int `json:"unknown"`  // reports of a message we have no history of (or none named): ignored
	Ignored  int `json:"ignored"`  // events read that are none of ours to apply (an open, a click, a queued status)
	Replayed int `json:"replayed"` // reports applied before: nothing done again
	// Confirmed: an SNS subscription was confirmed.
	Confirmed bool `json:"confirmed,omitempty"`
}

// Errors of Receive, which the API answers with 404, 400, 403 and 409;
// any other is Redis's, or a subscription's confirmation that failed
// (503: the vendor retries).
var (
	// ErrNoProvider: no provider of that name reads its feedback here.
	ErrNoProvider = errors.New("feedback: no such provider")
	// ErrMalformed: the body is not what the vendor sends.
	ErrMalformed = errors.New("feedback: malformed")
	// ErrSignature: the request is unsigned, its signature does not
	// verify (a signing certificate from elsewhere, or not trusted, or
	// the wrong key), its time is outside the tolerance, or it comes
	// from an SNS topic not configured.
	ErrSignature = errors.New("feedback: not signed by the provider")
	// ErrReplayed: every report of the request was applied before: a
	// request sent again changes nothing.
	ErrReplayed = errors.New("feedback: replayed")
)
