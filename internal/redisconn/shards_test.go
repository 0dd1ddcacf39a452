//go:build integration

package redisconn_test

import (
	"context"
	"testing"

	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// TestShards: redis.shards is the cluster's masters by default (its
// replicas not counted), 1 on one Redis, and what the config says when set.
func TestShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redistest.StartCluster(t, 3, 1)
	cl, closeCluster, err := redisconn.Connect(ctx, redisconn.Config{Cluster: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCluster()
	one := redistest.Start(t).Client(t)
	for _, tc := range []struct {
		name string
		cfg  redisconn.Config
		want int
	}{
		{"a cluster of 3 masters", redisconn.Config{Cluster: c.Addrs()}, 3},
		{"a cluster, set", redisconn.Config{Cluster: c.Addrs(), Shards: 5}, 5},
		{"one Redis", redisconn.Config{URL: "redis://x"}, 1},
		{"one Redis, set", redisconn.Config{URL: "redis://x", Shards: 2}, 2},
	} {
		rdb := cl
		if tc.cfg.Cluster == nil {
			rdb = one
		}
		if got, err := redisconn.Shards(ctx, tc.cfg, rdb); err != nil || got != tc.want {
			t.Errorf("%s: Shards = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
}
