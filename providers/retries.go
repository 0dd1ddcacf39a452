package providers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// Retries is a provider with its own retry settings for temporary failures
// (a 5xx, a timeout, a lost connection: errors that are no SendError).
// It is a Scoper when the provider it wraps is.
type Retries struct {
	Scoper
	Max     int                       // retries before the message is archived; 0: the task's own (asynq's MaxRetry)
	Backoff time.Duration             // the first wait, doubled after each failure (at most a day); 0: asynq's
	retried func(context.Context) int // how many times the task failed before: asynq's count (tests replace it)
}

// WithRetries returns p with its own retry settings, or p if both are zero.
func WithRetries(p Scoper, max int, backoff time.Duration) Scoper {
	if max == 0 && backoff == 0 {
		return p
	}
	return &Retries{Scoper: p, Max: max, Backoff: backoff, retried: func(ctx context.Context) int {
		n, _ := asynq.GetRetryCount(ctx)
		return n
	}}
}

// Send sends m and applies the settings to a temporary failure.
func (r *Retries) Send(ctx context.Context, m Message) (string, error) {
	id, err := r.Scoper.Send(ctx, m)
	var se *SendError
	if err == nil || errors.As(err, &se) {
		return id, err
	}
	retried := r.retried(ctx)
	if r.Max > 0 && retried >= r.Max {
		return "", &SendError{Outcome: Reject, Err: fmt.Errorf("gave up after %d retries: %w", retried, err)}
	}
	if r.Max > 0 {
		err = &budgeted{max: r.Max, err: err}
	}
	if r.Backoff > 0 {
		return "", &Backoff{Delay: min(r.Backoff<<min(retried, 20), 24*time.Hour), Err: err}
	}
	return "", err
}

// budgeted is a temporary failure under a provider's own limit of retries.
type budgeted struct {
	max int
	err error
}

func (e *budgeted) Error() string { return e.err.Error() }
func (e *budgeted) Unwrap() error { return e.err }

// RetryBudget returns how many retries a temporary failure err gets from
// its provider's own limit (Retries.Max), and whether it has one.
func RetryBudget(err error) (int, bool) {
	var b *budgeted
	if errors.As(err, &b) {
		return b.max, true
	}
	return 0, false
}
