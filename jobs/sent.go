package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/throttle"
)

// DefaultSentTTL is how long a sent marker lasts unless SentMarks.TTL says
// otherwise. A marker must outlive its task's redelivery, which asynq makes
// within about 3 minutes of a crash or of Redis coming back (lease, then
// recoverer, then retry delay). An hour covers that twenty times over, and
// a producer re-enqueuing the same idempotency key within the hour. A
// marker costs about 165 bytes of Redis memory: 60 MB at 100 sends/s.
const DefaultSentTTL = time.Hour

// SentMarks remembers, per task ID, that a provider accepted the task's
// message. Throttle writes a marker on the provider's acknowledgement and
// its admission checks for one (throttle.Request.Done), so a redelivered job
// whose send succeeded completes without sending, taking or giving back
// anything. It cannot close the window between the provider's answer and
// the marker's write, nor two deliveries of one task at once (asynq requeues
// at ShutdownTimeout while a handler may still run): the provider's
// Idempotency-Key is for those. A SentMarks is safe for concurrent use.
type SentMarks struct {
	rdb    redis.UniversalClient
	prefix string
	// TTL is how long a marker lasts. Default DefaultSentTTL.
	TTL time.Duration
}

// NewSentMarks returns the sent markers on rdb, under the throttle's key
// prefix ("" means throttle.DefaultPrefix).
func NewSentMarks(rdb redis.UniversalClient, prefix string) *SentMarks {
	if prefix == "" {
		prefix = throttle.DefaultPrefix
	}
	return &SentMarks{rdb: rdb, prefix: prefix, TTL: DefaultSentTTL}
}

// Key returns the marker's key, "<prefix>sent:{<task id>}". The task ID is
// the hash tag, so on a cluster each marker lives in its task's slot; the
// engine's keys always have '{' right after the prefix, so they cannot meet.
func (s *SentMarks) Key(id string) string { return sentKey(s.prefix, id) }

// Mark records that task id was sent at (the worker's clock, for people).
func (s *SentMarks) Mark(ctx context.Context, id string, at time.Time) error {
	ttl := s.TTL
	if ttl <= 0 {
		ttl = DefaultSentTTL
	}
	if err := s.rdb.Set(ctx, s.Key(id), at.UnixMilli(), ttl).Err(); err != nil {
		return fmt.Errorf("jobs: mark %q sent: %w", id, err)
	}
	return nil
}
