package jobs

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// Backlog watches whether work waits in asynq's queues that no worker has
// picked up yet: their pending lists are not all empty. A job that books
// while there is (throttle.Request.Backlog) and cannot go at once takes a
// place in its tenant's line instead of sleeping in the worker for a slot
// within InlineWait: the worker moves on to the jobs behind it, so a tenant
// queued behind another's backlog is seen, and served its share, at once.
// Without it, a worker whose concurrency is below rate x InlineWait sleeps
// through the backlog in the order it was queued.
//
// It reads each queue's pending length every Every, on one Redis round trip:
// a cost per worker and second, not per job.
type Backlog struct {
	rdb    redis.UniversalClient
	queues []string
	every  time.Duration
	seen   atomic.Bool
}

// BacklogEvery is how often a Backlog looks at the queues by default.
const BacklogEvery = 200 * time.Millisecond

// NewBacklog returns a Backlog of queues on rdb (asynq's Redis) that looks
// every every (BacklogEvery if 0). Call Run to start it.
func NewBacklog(rdb redis.UniversalClient, queues []string, every time.Duration) *Backlog {
	if every <= 0 {
		every = BacklogEvery
	}
	return &Backlog{rdb: rdb, queues: queues, every: every}
}

// Waiting reports whether work waited unseen when the queues were last
// read. Nil, or before the first read, it reports false.
func (b *Backlog) Waiting() bool { return b != nil && b.seen.Load() }

// Run reads the queues until ctx ends. A read that fails says nothing
// waits: a job then books as it would without a Backlog.
func (b *Backlog) Run(ctx context.Context) {
	tick := time.NewTicker(b.every)
	defer tick.Stop()
	for {
		b.seen.Store(b.read(ctx))
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// read reports whether any queue's pending list holds a task.
func (b *Backlog) read(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, b.every)
	defer cancel()
	cmds, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, q := range b.queues {
			p.LLen(ctx, asynqdb.PendingKey(q))
		}
		return nil
	})
	if err != nil {
		return false
	}
	for _, c := range cmds {
		if c.(*redis.IntCmd).Val() > 0 {
			return true
		}
	}
	return false
}
