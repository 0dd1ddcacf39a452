package redisconn

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redisguard"
)

// ReloadGap is the least time between two reloads of a cluster client's
// slot map that failed calls ask for (docs/operations.md#redis-cluster,
// "When a master fails").
const ReloadGap = 500 * time.Millisecond

// Timeouts of a cluster client, so that a call to a node that stopped
// answering comes back, and asks for the reload, in seconds.
const (
	clusterDialTimeout = 2 * time.Second // a connection attempt, TLS included
	clusterDialRetries = 1
	clusterReadTimeout = 3 * time.Second // as go-redis's default for one node
)

// followFailovers makes cc reload its slot map when a node cannot be
// reached. It must be called before cc's first call, so that every node
// client gets the hook.
func followFailovers(cc *redis.ClusterClient, gap time.Duration) {
	r := &reloader{reload: func() { cc.ReloadState(context.Background()) }, gap: gap}
	hook := redisguard.Observer(func(_ context.Context, err error) { r.observe(err, time.Now()) })
	cc.OnNewNode(func(node *redis.Client) { node.AddHook(hook) })
}

// reloader asks for the reloads of one cluster client. Safe for concurrent
// use.
type reloader struct {
	reload func()
	gap    time.Duration
	last   atomic.Int64 // when a reload was last asked for, Unix ns; 0: never
}

func (r *reloader) observe(err error, now time.Time) {
	if err != nil && redisguard.Unreachable(err) && r.due(now) {
		r.reload()
	}
}

// due reports whether a reload may be asked for at now, and records it:
// true at most once per gap, however many callers ask at once.
func (r *reloader) due(now time.Time) bool {
	last := r.last.Load()
	if last != 0 && now.UnixNano()-last < int64(r.gap) {
		return false
	}
	return r.last.CompareAndSwap(last, now.UnixNano())
}
