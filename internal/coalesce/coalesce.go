// Package coalesce lets the single commands a worker's concurrent handlers
// send on the hot path share round trips to Redis (docs/design.md#how-the-lua-runs).
// Every command sent this way must be idempotent: the pipeliner may retry a
// batch that failed part way.
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

// Of returns what the hot path sends its single commands through: a
// *redis.Client's shared auto-pipeliner, which go-redis closes with the
// client; else (a cluster, or no pipeliner to be had) rdb itself.
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
