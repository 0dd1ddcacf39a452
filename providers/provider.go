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
// its ID for it ("" if none: docs/providers.md#the-providers-message-id);
// otherwise a *SendError says what to do (any other error is retried), the
// recipient shown only redacted (RedactError).
type Provider interface {
	Send(ctx context.Context, m Message) (id string, err error)
}

// Outcome classifies a failed send. Every provider maps its answers into
// these; docs/providers.md#one-classification says what the worker does
// with each, and lists each vendor's answers.
type Outcome int

const (
	Retry  Outcome = iota // may work later; deferred, not failed, when RetryAt or RetryAfter says when
	Pause                 // the provider asks for a pause (429): the whole provider, or only Scope
	Reject                // refused for good: archived
	Dead                  // the address is dead: archived, and the address suppressed
	Broken                // credentials or account broken: the provider paused fleet-wide (BrokenPause)
)

// BrokenPause is how long a Broken outcome pauses its provider when the
// error does not say.
const BrokenPause = time.Minute

// SendError is a failed send with what to do about it.
type SendError struct {
	Outcome    Outcome
	RetryAfter time.Duration // how long to wait (Pause, Broken, Retry)
	RetryAt    time.Time     // if set, the moment instead, turned into a wait by Redis's clock
	Scope      string        // for Pause, what it holds ("" the whole provider; see SenderScope, PairScope, DeviceScope)
	Err        error
}

func (e *SendError) Error() string { return e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// Unreached classifies err, a send that got no answer from its provider:
// an untrusted certificate is Broken, as no retry helps; anything else is a
// temporary failure, err as is (docs/providers.md#one-classification).
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

// RedactError returns err with its text showing recipient only as
// message.Redact does, in every form docs/providers.md#what-is-redacted
// lists; every provider returns its errors through it. A *SendError stays
// one, its Err redacted; the original error stays in the chain for
// errors.Is and errors.As. nil stays nil.
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
// in, which the worker checks just before its send (package screen).
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
// deliver to (package address): a job whose recipient it refuses is
// archived as malformed, unsent (docs/operations.md#the-http-api, "What a
// notification must be").
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
