// Package coalesce lets the single commands that a worker's concurrent
// handlers send on the hot path (the admission's function call, recovery's
// record of a task taken) share round trips to Redis: where nothing is
// throttled, the system calls of a round trip per command, not the
// commands, are most of what the throttler adds to a bare asynq worker.
// How, and why the done marker's SET does not go this way:
// docs/design.md#how-the-lua-runs. Every command sent this way is
// idempotent (an admission by task ID; SADD), so the pipeliner's retry of a
// batch that failed part way cannot do harm.
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
