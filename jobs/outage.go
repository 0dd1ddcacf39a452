package jobs

import (
	"context"
	"time"

	"github.com/notify-throttle/throttler/internal/redisguard"
)

// Why a handler waits out a Redis outage instead of returning:
//
// asynq writes a handler's result (done, retry at, archived) to Redis when
// the handler returns. If Redis is unreachable then, the result is lost:
// v0.26 hands the failed write to its syncer with a context it has already
// cancelled (processor.go, markAsComplete, retry and friends: the "defer
// cancel()" of hibiken/asynq#926), so the syncer's retries never succeed.
// The task stays in the active set until its lease expires and the
// recoverer, a minute or two after Redis is back, redelivers it: late, and
// sent twice if its send had succeeded.
//
// So while Redis is unreachable the middleware keeps retrying its own calls
// (the admission, the sent-marker check and write) once a second, for as
// long as the task's context lives. asynq cancels that context when the
// lease expires (30s without a heartbeat reaching Redis) or at shutdown. An
// outage shorter than the lease then costs a pause and nothing else: every
// handler returns after Redis is back, and asynq records its result.

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
