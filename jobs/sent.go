package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/throttle"
)

// DefaultSentTTL is how long a sent marker lasts unless SentMarks.TTL says
// otherwise. A marker must outlive the redelivery of its task. asynq
// redelivers a task whose result was lost once its lease (30s) has been
// expired for 30s, on the recoverer's next run (every minute), after the
// retry delay (15-45s for a first failure): within about 3 minutes of a
// worker's crash, or of Redis answering again after an outage (the marker
// is written as soon as it does; see markSent). An hour covers that twenty
// times over and also catches a producer enqueuing the same idempotency
// key again within the hour, after asynq has dropped the completed task. A
// marker costs about 165 bytes of Redis memory (used_memory per key, with
// its expiry), so 100 sends/s keep about 60 MB of them.
const DefaultSentTTL = time.Hour

// SentMarks remembers, per task ID, that a provider accepted the task's
// message: Throttle sets a marker when the provider acknowledges, and its
// admission of a job checks for one (throttle.Request.Done: on a single node
// inside the admission's script call, at no extra round trip), so a
// redelivered job whose send already succeeded completes without being sent
// again, without taking quota again and without giving back what its first
// delivery took. What it cannot
// close is the window between the provider's answer and the marker's write
// (a crash there, or Redis lost there), nor two deliveries of one task
// running at once (asynq requeues a task at ShutdownTimeout while its
// handler may still run): those are what the provider's Idempotency-Key is
// for. A SentMarks is safe for concurrent use.
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
func (s *SentMarks) Key(id string) string { return s.prefix + "sent:{" + id + "}" }

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
