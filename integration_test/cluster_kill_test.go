//go:build integration

package integration_test

// A Redis Cluster master that crashes mid-drain: kill -9 of the master
// holding the queue, with no CLUSTER FAILOVER; the cluster flags it after
// cluster-node-timeout (2000 ms) and promotes its replica, 3-5 s after the
// kill. The dead node stays down (TestClusterMasterKilled), or comes back
// as a supervisor would start it, after the promotion
// (TestClusterMasterKilledAndBack). What is judged is what the provider
// saw: every notification sent, none twice beyond the bound
// docs/operations.md states, no rule broken (checkRun), and deliveries
// going again within resumeWithin of the kill (issue 40).

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// The run's parameters: 2 workers of concurrency 10 drain 240
// notifications, 4 to each of 60 recipients, through a provider of 20/s,
// which is what binds (the windows let 36/s through), so deliveries are
// steady, 50 ms apart, and a stall stands out.
const (
	killRecipients = 60
	killPer        = 4
	killRate       = 20
	killBurst      = 5
	killWorkers    = 2
	killSlots      = 10 // worker.concurrency
	// resumeWithin is issue 40's bound from the kill to deliveries going
	// again; the cluster's own failover takes 3-5 s of it.
	resumeWithin = 15 * time.Second
)

var killWindows = []quotaWindow{{2, time.Second}, {3, 5 * time.Second}}

const killPolicy = "[{limit: 2, per: 1s}, {limit: 3, per: 5s}]"

// TestClusterMasterKilled: the queue's master killed with kill -9 once a
// third of the notifications were sent, and left down.
func TestClusterMasterKilled(t *testing.T) {
	killRun(t, "kd", func(s *redistest.Server) { s.Kill() }, false)
}

// TestClusterMasterKilledAndBack: as TestClusterMasterKilled, and the dead
// node started again once its replica has taken over; it rejoins as that
// replica's replica.
func TestClusterMasterKilledAndBack(t *testing.T) {
	killRun(t, "kb", func(s *redistest.Server) { s.Kill() }, true)
}

// TestClusterMasterFrozen: as TestClusterMasterKilled for a master that
// stops answering without closing anything (SIGSTOP, until the test's end:
// a hung host, a partition), so that calls to it time out instead of being
// refused.
func TestClusterMasterFrozen(t *testing.T) {
	killRun(t, "kf", func(s *redistest.Server) { s.Freeze(t) }, false)
}

// killRun is one run: the fleet on 3 masters with a replica each (AOF),
// fail of the queue's master, the promotion, the node back if back, then
// the checks.
func killRun(t *testing.T, tag string, fail func(*redistest.Server), back bool) {
	cfg := fleetConfig{
		Concurrency:     killSlots,
		ShutdownTimeout: 5 * time.Second,
		InlineWait:      time.Second,
		Jitter:          300 * time.Millisecond,
		Policy:          killPolicy,
		Rate:            killRate,
		Burst:           killBurst,
		Book:            true,
		Durable:         true,
	}
	f := newClusterFleet(t, 3, 1, cfg, nil)
	notes := f.enqueueNotes(tag, killRecipients, killPer, 0, 0)
	ws := f.startWorkers("w1", "w2")

	waitFor(t, "a third of the notifications sent", func() bool { return len(f.hook.delivered()) >= len(notes)/3 })
	i := f.queueMaster()
	dead := f.cluster.Masters[i]
	fail(dead)
	killed := time.Now()
	sentAtKill := len(f.hook.delivered())
	promoted := f.cluster.AwaitPromotion(t, i)
	promotedAfter := time.Since(killed)
	t.Logf("the queue's master %s failed with %d of %d sent; its replica %s promoted %s after the failure",
		dead.Addr, sentAtKill, len(notes), promoted.Addr, promotedAfter.Round(time.Millisecond))
	if back {
		f.cluster.Rejoin(t, dead)
		t.Logf("%s back as %s's replica %s after the kill", dead.Addr, promoted.Addr, time.Since(killed).Round(time.Millisecond))
	}

	// Past the sends the fleet held at the kill, new work is flowing. (The
	// test's own client follows the failover as the workers' does.)
	waitUntil(t, "deliveries after the kill", 2*time.Minute, func() bool {
		return len(f.hook.delivered()) > sentAtKill+killWorkers*killSlots
	})
	f.waitAllEnded(90*time.Second, notes)
	m := f.metricsOf(ws...)
	for _, w := range ws {
		f.stop(w)
	}
	f.masterLost = true
	c := checkRun(t, f, notes, killWindows, true)
	if got, want := m[`throttler_sent_total{provider="hook"}`], float64(c.sent+c.dupSends); got != want {
		t.Errorf("metrics: throttler_sent_total = %g, want %g", got, want)
	}
	// A task is sent twice only if the dead master had acknowledged its
	// dequeue or its sent marker without passing it on to the replica: one
	// the fleet held at the kill, at most.
	if bound := killWorkers * killSlots; c.dupTasks > bound {
		t.Errorf("%d tasks sent twice (%v), more than the %d the fleet can hold at a kill", c.dupTasks, c.dups, bound)
	}
	// Likewise a ledger entry the dead master had acknowledged and not
	// passed on (Redis replicates asynchronously): the send it admitted
	// went, and the promoted replica never had its token. Seen once in a CI
	// run: one task.
	if bound := killWorkers * killSlots; len(c.noToken) > bound {
		t.Errorf("%d tasks sent with no ledger entry (%v), more than the %d the fleet can hold at a kill", len(c.noToken), c.noToken, bound)
	} else if len(c.noToken) > 0 {
		t.Logf("sent with no ledger entry, the dead master's unreplicated writes: %v", c.noToken)
	}
	from, to := stall(f.hook.snapshot(), killed)
	t.Logf("deliveries stopped %s after the kill, resumed %s after it (a gap of %s); %s",
		from.Sub(killed).Round(time.Millisecond), to.Sub(killed).Round(time.Millisecond), to.Sub(from).Round(time.Millisecond), c)
	if to.Sub(killed) > resumeWithin {
		t.Errorf("deliveries resumed %s after the kill, want within %s", to.Sub(killed).Round(time.Millisecond), resumeWithin)
	}
}

// queueMaster returns the index in the cluster's Masters of the master
// holding the most of the queues asynq knows (the fleet's one queue).
func (f *fleet) queueMaster() int {
	f.t.Helper()
	queues, err := f.insp.Queues()
	if err != nil || len(queues) == 0 {
		f.t.Fatalf("asynq's queues: %v, %v", queues, err)
	}
	held := make([]int, len(f.cluster.Masters))
	for _, q := range queues {
		m, err := f.rdb.(*redis.ClusterClient).MasterForKey(context.Background(), asynqdb.PendingKey(q))
		if err != nil {
			f.t.Fatal(err)
		}
		i := slices.IndexFunc(f.cluster.Masters, func(s *redistest.Server) bool { return s.Addr == m.Options().Addr })
		if i < 0 {
			f.t.Fatalf("queue %s on %s, not a master of the cluster", q, m.Options().Addr)
		}
		held[i]++
	}
	return slices.Index(held, slices.Max(held))
}

// stall returns the longest gap in arrivals after killed (counting from
// killed itself): the last arrival before it, or killed, and the first
// after it. The sends in flight at the kill arrive just after it; the
// stall follows them.
func stall(arrivals []arrival, killed time.Time) (from, to time.Time) {
	times := []time.Time{killed}
	for _, a := range arrivals {
		if a.At.After(killed) {
			times = append(times, a.At)
		}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	from, to = killed, killed
	for k := 1; k < len(times); k++ {
		if times[k].Sub(times[k-1]) > to.Sub(from) {
			from, to = times[k-1], times[k]
		}
	}
	return from, to
}
