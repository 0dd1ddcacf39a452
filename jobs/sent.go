package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/notify-throttle/throttler/throttle"
)

// defaultSentTTL is how long a sent marker lasts unless SentMarks.TTL says
// otherwise. A marker must outlive its task's redelivery, which asynq makes
// within about 3 minutes of a crash or of Redis coming back (lease, then
// recoverer, then retry delay). An hour covers that twenty times over, and
// a producer re-enqueuing the same idempotency key within the hour. A
// marker costs about 165 bytes of Redis memory: 60 MB at 100 sends/s.
const defaultSentTTL = time.Hour

// SentMarks remembers, per task ID, that a provider accepted the task's
// message: the task's done marker in the throttle (Limiter.MarkDone),
// which its admission checks for (throttle.Request.CheckDone), so a
// redelivered job whose send succeeded completes without sending, taking or
// giving back anything. It cannot close the window between the provider's
// answer and the marker's write, nor two deliveries of one task at once
// (asynq requeues at ShutdownTimeout while a handler may still run): the
// provider's Idempotency-Key is for those. A SentMarks is safe for
// concurrent use.
type SentMarks struct {
	lim *throttle.Limiter
	// TTL is how long a marker lasts. Default defaultSentTTL.
	TTL time.Duration
}

// NewSentMarks returns the sent markers kept by lim.
func NewSentMarks(lim *throttle.Limiter) *SentMarks {
	return &SentMarks{lim: lim, TTL: defaultSentTTL}
}

// ttl is how long a marker lasts: 0 for no markers (s nil).
func (s *SentMarks) ttl() time.Duration {
	switch {
	case s == nil:
		return 0
	case s.TTL <= 0:
		return defaultSentTTL
	}
	return s.TTL
}

// Mark records that task id was sent at (the worker's clock, for people).
func (s *SentMarks) Mark(ctx context.Context, id string, at time.Time) error {
	if err := s.lim.MarkDone(ctx, id, at, s.ttl()); err != nil {
		return fmt.Errorf("jobs: mark %q sent: %w", id, err)
	}
	return nil
}

// SentAt returns when task id was marked sent, and false if it was not.
func (s *SentMarks) SentAt(ctx context.Context, id string) (time.Time, bool, error) {
	return s.lim.DoneAt(ctx, id)
}
