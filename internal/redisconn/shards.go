package redisconn

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// MaxShards bounds redis.shards: each shard is an asynq queue that every
// worker polls.
const MaxShards = 64

// Shards returns how many shards each queue has (asynqdb.Shard): r.Shards if
// set, else 1 on one Redis and the number of masters on a cluster, which
// producers and workers count alike (docs/operations.md#redis-cluster).
func Shards(ctx context.Context, r Config, rdb redis.UniversalClient) (int, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if r.Shards > 0 || !ok {
		return max(r.Shards, 1), nil
	}
	var masters atomic.Int32
	err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error {
		masters.Add(1)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("redis.shards: count the cluster's masters: %w", err)
	}
	return min(max(int(masters.Load()), 1), MaxShards), nil
}
