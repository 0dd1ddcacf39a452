package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
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
// Send returns nil once the provider has accepted the message; otherwise a
// *SendError says what to do about it (any other error is retried).
type Provider interface {
	Send(ctx context.Context, m Message) error
}

// Outcome classifies a failed send.
type Outcome int

const (
	// Retry: the send may work later (5xx, timeout, network): retried with backoff.
	Retry Outcome = iota
	// Pause: the provider asks for a pause (429): every worker holds off for
	// RetryAfter and the job is deferred, not failed.
	Pause
	// Reject: the provider refuses this message for good (4xx): archived.
	Reject
)

// SendError is a failed send with what to do about it.
type SendError struct {
	Outcome    Outcome
	RetryAfter time.Duration // for Pause
	Err        error
}

func (e *SendError) Error() string { return e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// outcome returns what to do after err from Send.
func outcome(err error) (Outcome, time.Duration) {
	var se *SendError
	if errors.As(err, &se) {
		return se.Outcome, se.RetryAfter
	}
	return Retry, 0
}

// sendErrorf is a SendError with a formatted message.
func sendErrorf(o Outcome, after time.Duration, format string, args ...any) *SendError {
	return &SendError{Outcome: o, RetryAfter: after, Err: fmt.Errorf(format, args...)}
}

// ProviderFunc adapts a function to a Provider.
type ProviderFunc func(ctx context.Context, m Message) error

// Send calls f.
func (f ProviderFunc) Send(ctx context.Context, m Message) error { return f(ctx, m) }
