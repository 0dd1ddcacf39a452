package jobs

import (
	"errors"
	"time"
)

// Backoff is a failed send retried after Delay rather than asynq's default
// backoff: a provider's own retry settings (providers.WithRetries). Unlike a
// Deferral it is a failure, and uses up one of the task's retries.
type Backoff struct {
	Delay time.Duration
	Err   error
}

func (b *Backoff) Error() string { return b.Err.Error() }
func (b *Backoff) Unwrap() error { return b.Err }

// backoffDelay returns the delay of a Backoff in err, and whether there is one.
func backoffDelay(err error) (time.Duration, bool) {
	var b *Backoff
	if errors.As(err, &b) && b.Delay > 0 {
		return b.Delay, true
	}
	return 0, false
}
