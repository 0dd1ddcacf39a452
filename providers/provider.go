package providers

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/message"
)

// Message is what a provider delivers.
type Message struct {
	// ID is the task ID: providers pass it on as an idempotency key.
	ID        string          `json:"id"`
	Recipient string          `json:"recipient"`
	Template  string          `json:"template"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// Provider delivers messages. A new provider is one type with this method.
// Send returns a nil error once the provider has accepted the message, with
// the provider's ID for it (the one its later reports of the message name:
// Twilio's SID, SES's MessageId; "" if it gives none); otherwise a
// *SendError says what to do about it (any other error is retried).
// Its error never shows the recipient in clear (see RedactError): the
// worker logs it, and keeps it as a suppression's reason.
type Provider interface {
	Send(ctx context.Context, m Message) (id string, err error)
}

// Outcome classifies a failed send. Every provider maps its answers into
// these; docs/providers.md lists each vendor's.
type Outcome int

const (
	// Retry: the send may work later (5xx, timeout, network): retried with
	// backoff, or at RetryAt / after RetryAfter when the provider says when
	// (then deferred, not failed).
	Retry Outcome = iota
	// Pause: the provider asks for a pause (429). With no Scope every worker
	// holds the whole provider off until RetryAt or for RetryAfter; with a
	// Scope only that scope's messages are held (see Screen). The job is
	// deferred, not failed.
	Pause
	// Reject: the provider refuses this message for good (4xx): archived.
	Reject
	// Dead: the recipient's address is dead (an unregistered device, an
	// invalid or unsubscribed number): archived, and the address is
	// suppressed so that later messages to it are archived without a send.
	Dead
	// Broken: the provider's credentials or account are broken: the whole
	// provider is paused fleet-wide (RetryAfter, else BrokenPause), logged
	// as an error and counted (Metrics.Broken); the job is deferred.
	Broken
)

// BrokenPause is how long a Broken outcome pauses its provider when the
// error does not say.
const BrokenPause = time.Minute

// SendError is a failed send with what to do about it.
type SendError struct {
	Outcome Outcome
	// RetryAfter is how long to wait (Pause, Broken, Retry); RetryAt, if
	// set, is the moment instead (an epoch from the provider: a rate-limit
	// or quota reset), turned into a wait by Redis's clock.
	RetryAfter time.Duration
	RetryAt    time.Time
	// Scope, for Pause, is what the pause holds ("" the whole provider; see
	// SenderScope, PairScope, DeviceScope).
	Scope string
	Err   error
}

func (e *SendError) Error() string { return e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// Unreached classifies err, the failure of a send that got no answer from
// its provider (no connection, a timeout, a TLS handshake that failed).
// A certificate the worker does not trust is Broken: nothing reached the
// provider, and no retry helps until its ca_file or its certificate
// changes, so the provider is paused fleet-wide and the operator alerted
// rather than the message retried and archived. Anything else is a
// temporary failure: err as is. Every provider classifies such a failure
// here.
func Unreached(err error) error {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) {
		return &SendError{Outcome: Broken, Err: fmt.Errorf("%w (the provider's certificate is not trusted: a private CA goes in its ca_file)", err)}
	}
	return err
}

// Func adapts a function to a Provider.
type Func func(ctx context.Context, m Message) (string, error)

// Send calls f.
func (f Func) Send(ctx context.Context, m Message) (string, error) { return f(ctx, m) }

// RedactError returns err with its text showing recipient only as message.Redact
// does, wherever it showed it: as given, in another case (an address),
// without its + (a number), or escaped for a URL (a device token in a
// request's path). A service's answer often names the recipient ("The
// 'To' number +1555... is not a valid phone number"), and a failed
// request's error its URL; every provider returns its errors through this,
// so that the log, a task's last error and a suppression's reason keep the
// redaction promise, and the rest of the text (the service's code, the
// status) stays. A *SendError stays one, its Err redacted; the original
// error stays in the chain for errors.Is and errors.As. nil stays nil.
func RedactError(err error, recipient string) error {
	if err == nil || recipient == "" {
		return err
	}
	var se *SendError
	if !errors.As(err, &se) {
		return redactText(err, recipient)
	}
	c := *se
	c.Err = redactText(se.Err, recipient)
	if error(se) == err {
		return &c
	}
	return &redactedError{text: redactIn(err.Error(), recipient), err: &c}
}

// redactedError is an error whose text is another's with the recipient
// redacted (see RedactError).
type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }

// redactText returns err, or a redactedError if its text shows recipient.
func redactText(err error, recipient string) error {
	text := redactIn(err.Error(), recipient)
	if text == err.Error() {
		return err
	}
	return &redactedError{text: text, err: err}
}

// redactIn replaces every form of recipient in text (see RedactError) with
// message.Redact(recipient).
func redactIn(text, recipient string) string {
	forms := []string{recipient, url.PathEscape(recipient), url.QueryEscape(recipient)}
	if digits, ok := strings.CutPrefix(recipient, "+"); ok && digits != "" {
		forms = append(forms, digits)
	}
	// The longest first, so that +1555... goes whole, not as + and 1555...
	slices.SortFunc(forms, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	quoted := make([]string, 0, len(forms))
	for _, f := range slices.Compact(forms) {
		quoted = append(quoted, regexp.QuoteMeta(f))
	}
	re := regexp.MustCompile(`(?i)` + strings.Join(quoted, "|"))
	return re.ReplaceAllLiteralString(text, message.Redact(recipient))
}

// Scoper is a provider whose pauses may hold less than all of it (one
// device, one number pair, one sender). Scopes returns the scopes m falls
// in, checked just before its send. The worker screens the messages of
// a Scoper provider (package screen): the adapters of real services are
// Scopers; log and webhook are not, and cost no extra round trip.
type Scoper interface {
	Provider
	Scopes(m Message) []string
}

// Scope names: a scope's kind, a colon, and what it holds.
func SenderScope(from string) string   { return "sender:" + from }
func PairScope(from, to string) string { return "pair:" + from + ">" + to }
func DeviceScope(token string) string  { return "device:" + token }
func ScopeKind(scope string) string    { kind, _, _ := strings.Cut(scope, ":"); return kind }

// Addresser is a Provider that knows which recipients its channel can
// deliver to (an E.164 number, an email address, a device token; see
// package address). A job whose recipient it refuses is archived as
// malformed when it is routed, without a send: intake refuses such a
// recipient at the door, and this catches what came another way (an
// older producer, a Go client, a provider whose type changed by a
// reload). Sent as it is, the vendor's invalid-address answer would
// suppress that string for good.
type Addresser interface {
	CheckRecipient(recipient string) error
}

// Backoff is a failed send retried after Delay rather than asynq's default
// backoff: a provider's own retry settings (WithRetries). Unlike a
// jobs.Deferral it is a failure, and uses up one of the task's retries.
type Backoff struct {
	Delay time.Duration
	Err   error
}

func (b *Backoff) Error() string { return b.Err.Error() }
func (b *Backoff) Unwrap() error { return b.Err }
