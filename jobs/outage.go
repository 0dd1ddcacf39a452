package jobs

import (
	"context"
	"time"

	"github.com/notify-throttle/throttler/internal/redisguard"
)

// Why a handler waits out a Redis outage instead of returning: asynq v0.26
// loses a result it cannot write (its syncer retries with an already
// cancelled context, hibiken/asynq#926), so the task is redelivered a minute
// or two later, sent twice if its send had succeeded. While Redis is
// unreachable the handler retries its own calls (admission, sent marker)
// once a second for as long as the task's context lives, which asynq ends
// when the lease expires (30s) or at shutdown. A shorter outage costs a
// pause and nothing else.

// retryInterval is the pause between two tries of a call that found Redis
// unreachable; the redisguard delays add to it.
const retryInterval = time.Second

// untilAnswered calls f until it returns nil or an error other than Redis
// being unreachable, or until ctx ends or stop closes, and returns f's last
// error.
func untilAnswered(ctx context.Context, stop <-chan struct{}, f func() error) error {
	for {
		err := f()
		if err == nil || !redisguard.Unreachable(err) {
			return err
		}
		t := time.NewTimer(retryInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		case <-stop:
			t.Stop()
			return err
		}
	}
}
