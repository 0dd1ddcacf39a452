package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// MarkDone marks task id done (Request.CheckDone) for ttl, noting at (the caller's clock: a
// note for people, never used in a decision).
func (l *Limiter) MarkDone(ctx context.Context, id string, at time.Time, ttl time.Duration) error {
	if err := checkID(id); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("throttle: mark %q done: ttl must be positive (got %s): %w", id, ttl, ErrInvalidRequest)
	}
	// The plain client, not the pipeliner: see internal/coalesce.
	if err := l.rdb.Set(ctx, keyspace.Done(l.prefix, id), at.UnixMilli(), ttl).Err(); err != nil {
		return fmt.Errorf("throttle: mark %q done: %w", id, err)
	}
	return nil
}

// DoneAt returns when task id was marked done (MarkDone's at), and false if
// it is not marked.
func (l *Limiter) DoneAt(ctx context.Context, id string) (time.Time, bool, error) {
	v, err := l.rdb.Get(ctx, keyspace.Done(l.prefix, id)).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("throttle: read %q's done marker: %w", id, err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, true, nil // marked, by something that noted no time
	}
	return time.UnixMilli(ms), true, nil
}
