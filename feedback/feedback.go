// Package feedback reads what SES (through SNS), SendGrid and Twilio report
// about the messages they accepted, at /v1/feedback/<provider>: each request
// is verified with the vendor's signature, then each report is applied once,
// as an event of its message (package lifecycle) and, for a dead address, a
// suppression (screen.Screen). What each report does:
// docs/providers.md#what-the-services-report-later; pointing the services
// here: docs/operations.md#the-providers-feedback.
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
	Type lifecycle.Type // Delivered, Bounced, Complained or Unsubscribed
	// Message is our message's ID, as the provider carried it along; ""
	// for a report of an address alone (a STOP reply).
	Message           string
	ProviderMessageID string
	Address           string // the recipient, which a suppression is of
	Reason            string // of a bounce: lifecycle.BouncedHard or BouncedSoft
	Detail            string // the provider's words, the address in them redacted
	// Vendor, of a report of an address alone, is the provider's own ID of
	// it (a reply's SID), by which it is applied once.
	Vendor string
}

// suppresses reports whether r makes its address dead for its provider.
func (r Report) suppresses() bool {
	return r.Type == lifecycle.Bounced && r.Reason == lifecycle.BouncedHard ||
		r.Type == lifecycle.Complained || r.Type == lifecycle.Unsubscribed
}

// Result is what a request's reports did.
type Result struct {
	Applied  int `json:"applied"`
	Unknown  int `json:"unknown"`  // of a message we have no history of (or none named): ignored
	Ignored  int `json:"ignored"`  // none of ours to apply (an open, a click, a queued status)
	Replayed int `json:"replayed"` // applied before: nothing done again
	// Confirmed: an SNS subscription was confirmed.
	Confirmed bool `json:"confirmed,omitempty"`
}

// Errors of Receive, which the API answers with 404, 400, 403 and 409; any
// other is Redis's or a failed SNS confirmation's (503: the vendor retries).
var (
	ErrNoProvider = errors.New("feedback: no such provider")
	ErrMalformed  = errors.New("feedback: malformed")
	// ErrSignature: unsigned, forged, signed outside the tolerance, by a
	// certificate not trusted, or from an SNS topic not configured.
	ErrSignature = errors.New("feedback: not signed by the provider")
	// ErrReplayed: every report of the request was applied before.
	ErrReplayed = errors.New("feedback: replayed")
)
