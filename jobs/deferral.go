package jobs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/providers"
)

// Deferral is what a handler returns for a job that may not go yet. asynq
// moves the task to its retry set in one step (the only atomic way to defer
// from a handler); RetryDelay picks the delay up from here and IsFailure
// keeps the deferral from counting as a failure or using up MaxRetry.
type Deferral struct {
	// Delay is how long the job must wait, as the throttle script said.
	Delay time.Duration
	// Reason says why, for the inspector: "throttled by policy marketing
	// (3 per 168h)", "booked for 14:03:05 by provider sms (2/s burst 20):
	// 317 ahead".
	Reason string
	// Exact says the job waits for a known moment (Delay from now: a
	// booking, a provider's Retry-After): it is woken after Wake, exactly,
	// with no jitter added (see Throttle.deferTo).
	Exact bool
	Wake  time.Duration
}

// Error returns e.g. "throttled by policy marketing (3 per 168h); next try
// in 17h2m", or for a booking its reason alone.
func (d *Deferral) Error() string {
	if d.Exact {
		return d.Reason
	}
	return fmt.Sprintf("%s; next try in %s", d.Reason, shortDuration(d.Delay))
}

// IsFailure is asynq's Config.IsFailure: a deferral is not a failure.
func IsFailure(err error) bool {
	var d *Deferral
	return !errors.As(err, &d)
}

// RetryDelay returns asynq's Config.RetryDelayFunc. A deferral waits its
// delay rounded up to whole seconds plus one (asynq keeps retry times in
// whole seconds of the worker's clock, so it would otherwise wake up to a
// second early), plus a random jitter in [0, jitter) so that thousands of
// jobs deferred together do not wake together. Other errors back off as
// asynq's default does.
func RetryDelay(jitter time.Duration) asynq.RetryDelayFunc {
	return func(n int, err error, t *asynq.Task) time.Duration {
		var d *Deferral
		var b *providers.Backoff
		if errors.As(err, &b) && b.Delay > 0 {
			return b.Delay
		}
		if !errors.As(err, &d) {
			return asynq.DefaultRetryDelayFunc(n, err, t)
		}
		if d.Exact {
			return d.Wake
		}
		delay := d.Delay.Truncate(time.Second)
		if delay < d.Delay {
			delay += time.Second
		}
		delay += time.Second
		if jitter > 0 {
			delay += rand.N(jitter)
		}
		return delay
	}
}

// clockTime prints a booked moment for people, in UTC: "14:03:05", with
// the date when it is not within a day of now.
func clockTime(at, now time.Time) string {
	at = at.UTC()
	if d := at.Sub(now); d > 20*time.Hour || d < -20*time.Hour {
		return at.Format("2006-01-02 15:04:05 UTC")
	}
	return at.Format("15:04:05")
}

// shortDuration prints a wait for people: "17h2m", "3s", "250ms".
func shortDuration(d time.Duration) string {
	switch {
	case d >= time.Hour:
		d = d.Round(time.Minute)
	case d >= time.Second:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Millisecond)
	}
	return timefmt.Duration(d)
}

// outcome returns what to do after err from Send.
func outcome(err error) (providers.Outcome, time.Duration) {
	var se *providers.SendError
	if errors.As(err, &se) {
		return se.Outcome, se.RetryAfter
	}
	return providers.Retry, 0
}
