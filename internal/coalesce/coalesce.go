// Package coalesce lets the single commands that a worker's concurrent
// handlers send on the hot path (the admission's function call, recovery's
// record of a task taken) share round trips to Redis.
//
// Each of those is one small command a handler waits for. Sent one at a
// time, each costs a write and a read on both sides of the connection, and
// where nothing is throttled those system calls, not the commands, are most
// of what the throttler adds to a bare asynq worker. Through the client's
// blocking auto-pipeliner the commands that handlers send while a batch is
// in flight go together in the next one: a handler alone still gets its
// answer in one round trip (no wait to gather a batch), and under load many
// handlers share each.
//
// Every command sent this way is idempotent (an admission is idempotent by
// task ID; SADD is), so the pipeliner's retry of a batch that failed part
// way cannot do harm. The done marker's SET is not sent this way: written
// after a send, it must keep trying while Redis is down and land as soon as
// Redis is back (jobs' outage.go), and through the pipeliner a SET sent
// into an outage hung past Redis's return (TestRedisOutageLosesNothing lost
// the results of 8 tasks), where the plain client's dial error lets the
// caller's loop wait the outage out.
package coalesce

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Processor runs one command and waits for its reply. *redis.Client,
// *redis.ClusterClient and *redis.AutoPipeliner are Processors.
type Processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// Of returns what the hot path sends its single commands through: for a
// *redis.Client (one node, or one a Sentinel names) the client's shared
// blocking auto-pipeliner, which go-redis closes with the client; for any
// other client (a cluster), or if the pipeliner cannot be had, rdb itself.
func Of(rdb redis.UniversalClient) Processor {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return rdb
	}
	ap, err := c.AutoPipeline()
	if err != nil {
		return rdb
	}
	return ap
}
