package redisconn

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redisguard"
)

// How a cluster client follows a failover, and why go-redis alone does not
// (it reloads its slot map on MOVED, ASK or once a minute, and a dead master
// sends no MOVED: go-redis issue 3979): docs/operations.md#redis-cluster.
// Every node client of a cluster client carries a hook that asks for a
// reload when a call cannot reach its node or finds the cluster down
// (redisguard.Unreachable), at most once per ReloadGap for the whole
// client: while a node stays unreachable the client polls the slot map
// every ReloadGap, and not otherwise.

// ReloadGap is the least time between two slot map reloads that failed
// calls ask for.
const ReloadGap = 500 * time.Millisecond

// Timeouts of a cluster client: a call to a node that stopped answering
// must come back (and ask for the reload) soon, where go-redis's defaults
// (5 s per dial, retried 5 times, 5 s per read) could hang it for half a
// minute. MaxRedirects stays go-redis's 3: a failed call is tried again on
// the slot's master in the map as it is by then, after a reload the
// promoted replica. asynq's calls go through the same client.
const (
	// clusterDialTimeout bounds one connection attempt, TLS handshake included.
	clusterDialTimeout = 2 * time.Second
	// clusterDialRetries: one attempt per call; MaxRedirects retries it.
	clusterDialRetries = 1
	// clusterReadTimeout bounds a reply, as go-redis's default for one
	// node: no call of the worker or of asynq blocks in Redis.
	clusterReadTimeout = 3 * time.Second
)

// followFailovers makes cc reload its slot map when a node cannot be
// reached (see above). It must be called before cc's first call, so that
// every node client gets the hook.
func followFailovers(cc *redis.ClusterClient, gap time.Duration) {
	r := &reloader{reload: func() { cc.ReloadState(context.Background()) }, gap: gap}
	hook := redisguard.Observer(func(_ context.Context, err error) { r.observe(err, time.Now()) })
	cc.OnNewNode(func(node *redis.Client) { node.AddHook(hook) })
}

// reloader asks for the reloads of one cluster client (see above). It is
// safe for concurrent use.
type reloader struct {
	reload func()
	gap    time.Duration
	last   atomic.Int64 // when a reload was last asked for, Unix ns; 0: never
}

// observe asks for a reload if err says the node is unreachable and no
// reload was asked for within gap before now.
func (r *reloader) observe(err error, now time.Time) {
	if err != nil && redisguard.Unreachable(err) && r.due(now) {
		r.reload()
	}
}

// due reports whether a reload may be asked for at now, and if so records
// it: true at most once per gap, however many callers ask at once.
func (r *reloader) due(now time.Time) bool {
	last := r.last.Load()
	if last != 0 && now.UnixNano()-last < int64(r.gap) {
		return false
	}
	return r.last.CompareAndSwap(last, now.UnixNano())
}
