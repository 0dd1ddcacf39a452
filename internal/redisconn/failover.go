package redisconn

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redisguard"
)

// How a cluster client follows a failover. go-redis v9 reloads its slot
// map on a MOVED or ASK reply, or when the map is older than
// ClusterStateReloadInterval (60 s since v9.22), but not when a node stops
// answering (go-redis issue 3979): a master killed outright answers
// nothing, so every call for its slots goes to its address and fails until
// the periodic reload, about a minute after its replica took over (which
// takes 3-5 s at cluster-node-timeout 2000). So every node client of a
// cluster client carries a hook that asks for a reload when a call to that
// node cannot reach it (refused, reset, timed out; see
// redisguard.Unreachable) or finds the cluster down, at most once per
// ReloadGap for the whole client. Until the cluster has promoted a replica,
// each reload still lists the dead master and the next failed call asks
// again: the client polls the slot map every ReloadGap while a node stays
// unreachable, and not otherwise. A flapping node costs at most one CLUSTER
// SLOTS per ReloadGap per process.

// ReloadGap is the least time between two slot map reloads that failed
// calls ask for.
const ReloadGap = 500 * time.Millisecond

// Timeouts of a cluster client: a node that stops answering must cost a
// call little more than a round trip, so that the call comes back (and the
// reload is asked for) soon. go-redis's defaults are 5 s per dial,
// retried 5 times, and 5 s per read, so a call to a silent node could hang
// for half a minute; a healthy node dials and answers in milliseconds.
// MaxRedirects stays go-redis's 3: a call that failed is tried again on the
// same node, then on the slot's master in the map as it is by then, which
// after a reload is the promoted replica. asynq's calls go through the
// same client, so they follow a failover as the worker's own do.
const (
	// clusterDialTimeout bounds one connection attempt, TLS handshake included.
	clusterDialTimeout = 2 * time.Second
	// clusterDialRetries: one attempt per call. The cluster client already
	// tries a call again (MaxRedirects), after a reload asked for meanwhile.
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
	cc.OnNewNode(func(node *redis.Client) { node.AddHook(r) })
}

// reloader is a go-redis hook, installed on each node client of one
// cluster client, that asks for a reload of the slot map when a call
// finds its node unreachable, at most once per gap. It is safe for
// concurrent use.
type reloader struct {
	reload func()
	gap    time.Duration
	last   atomic.Int64 // when a reload was last asked for, Unix ns; 0: never
}

// DialHook passes dials through: a failed dial fails the call, which
// ProcessHook sees, as it sees a dial the pool refused to make after
// repeated failures.
func (r *reloader) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook asks for a reload when a command could not reach its node.
func (r *reloader) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.observe(err, time.Now())
		return err
	}
}

// ProcessPipelineHook asks for a reload when a pipeline could not reach its node.
func (r *reloader) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		r.observe(err, time.Now())
		return err
	}
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
