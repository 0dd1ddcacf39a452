//go:build integration

package integration_test

// The pipeline on a Redis Cluster: the worker, enqueue and a
// campaign against 3 masters with a replica each, with TestPipeline's
// invariants (checkRun); and the same with masters failing over to their
// replicas in the middle of the run.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/campaign"
)

// clusterRun is one run on a cluster fleet: 20 recipients × 6
// notifications enqueued by the enqueue binary (the last two with
// deadlines of 6-7 s, so that some expire), three workers, and a campaign
// to the same 20 recipients triggered with enqueue -trigger once the workers
// run. during, if set, runs while the fleet works (after a third of the
// notifications were sent). It returns what checkRun found.
//
// TestClusterPipeline and TestClusterFailover run with inline_wait 0 (every
// provider wait deferred, nothing reserved ahead);
// TestClusterReservedSendKeepsRecipientWindows runs with inline_wait 1s
// and a slower provider (rate), so that many jobs reserve ahead.
func clusterRun(t *testing.T, tag string, inlineWait time.Duration, rate float64, during func(f *fleet)) runCounts {
	const recipients, per = 20, 6
	var audience strings.Builder
	for r := range recipients {
		fmt.Fprintf(&audience, "%s%03d@example.com\n", tag, r)
	}
	cfg := fleetConfig{
		Concurrency:     10,
		ShutdownTimeout: 5 * time.Second,
		InlineWait:      inlineWait,
		Jitter:          300 * time.Millisecond,
		Policy:          "[{limit: 2, per: 1s}, {limit: 4, per: 5s}]",
		Rate:            rate,
		Burst:           5,
		Campaigns: `
  - name: blast
    cron: "0 0 1 1 *"
    template: blast
    audience: {file: audience.txt}
`,
		Files: map[string]string{"audience.txt": audience.String()},
	}
	windows := []quotaWindow{{2, time.Second}, {4, 5 * time.Second}}
	f := newClusterFleet(t, 3, 1, cfg, nil)
	buildBinary(t, "worker")
	notes := f.enqueueNotes(tag, recipients, per, 4, 2*time.Second)
	ws := f.startWorkers("w1", "w2", "w3")

	out, stderr, code := runCommand(t, f.dir, nil, buildBinary(t, "enqueue"), "-config", f.writeConfig("enqueue", ""), "-trigger", "blast")
	name, at, ok := strings.Cut(strings.TrimSpace(out), "@")
	when, err := time.Parse(time.RFC3339, at)
	if code != 0 || !ok || name != "blast" || err != nil {
		t.Fatalf("enqueue -trigger blast: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	tick := campaign.NewTick("blast", when)
	for _, r := range strings.Fields(audience.String()) {
		id := tick.NotificationID(r)
		notes[id] = faultNote{id: id, recipient: r, template: "blast"}
	}
	if during != nil {
		waitFor(t, "a third of the notifications sent", func() bool { return len(f.hook.delivered()) >= len(notes)/3 })
		during(f)
	}
	q := f.waitAllEnded(90*time.Second, notes)
	m := f.metricsOf(ws...)
	for _, w := range ws {
		f.stop(w)
	}
	if q.Completed < 1 {
		t.Errorf("the campaign's fan-out task did not complete (queue: %+v)", q)
	}
	c := checkRun(t, f, notes, windows, during != nil)
	blasts := 0
	for id, n := range f.hook.delivered() {
		if notes[id].template == "blast" && n > 0 {
			blasts++
		}
	}
	if blasts != recipients {
		t.Errorf("the campaign reached %d of its %d recipients", blasts, recipients)
	}
	if got, want := m[`throttler_sent_total{provider="hook"}`], float64(c.sent+c.dupSends); got != want {
		t.Errorf("metrics: throttler_sent_total = %g, want %g", got, want)
	}
	t.Logf("%s (the campaign's %d included)", c, recipients)
	return c
}

// TestClusterPipeline: the whole pipeline on a Redis Cluster; nothing may
// be sent twice.
func TestClusterPipeline(t *testing.T) {
	c := clusterRun(t, "cl", 0, 25, nil)
	t.Logf("cluster: sent twice: %d", c.dupTasks)
}

// TestClusterFailover: as TestClusterPipeline, and once a third of the
// notifications were sent, the master holding the queue (asynq:{default})
// fails over to its replica, then the master holding the provider's bucket
// (if another). CLUSTER FAILOVER is the coordinated, manual kind: the old
// master stops writes until its replica has caught up, so no write is
// lost; the clients follow the MOVED redirections. Nothing may be lost and
// the limits hold; duplicates are counted and reported (none expected: no
// asynq lease expires and no acknowledged write is lost).
func TestClusterFailover(t *testing.T) {
	var failed []string
	c := clusterRun(t, "fo", 0, 25, func(f *fleet) {
		ctx := context.Background()
		seen := map[int]bool{}
		for _, key := range []string{"asynq:{" + fleetQueue + "}:pending", fleetPrefix + "{" + fleetProvider + "}:b:" + fleetProvider} {
			slot, err := f.rdb.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			i := int(slot) * len(f.cluster.Masters) / 16384 // redistest gives each master an even share
			for i+1 < len(f.cluster.Masters) && int(slot) >= (i+1)*16384/len(f.cluster.Masters) {
				i++
			}
			if seen[i] {
				continue
			}
			seen[i] = true
			start := time.Now()
			old := f.cluster.Masters[i].Addr
			nw := f.cluster.Failover(t, i)
			failed = append(failed, fmt.Sprintf("%s (slot %d): %s -> %s in %s, %d sent so far",
				key, slot, old, nw.Addr, time.Since(start).Round(time.Millisecond), len(f.hook.delivered())))
		}
	})
	if len(failed) == 0 {
		t.Fatal("no failover happened")
	}
	for _, s := range failed {
		t.Logf("failover: %s", s)
	}
	t.Logf("failover: sent twice: %d tasks (%d extra sends)", c.dupTasks, c.dupSends)
}

// TestClusterReservedSendKeepsRecipientWindows is TestClusterPipeline with
// inline_wait 1s and a provider of 12/s, so that many jobs reserve a
// provider token ahead and sleep until it is due.
//
// On a cluster the limiter admits the recipient's quota group first and
// only then reserves the provider token, up to MaxWait ahead; the quota
// entries move to the reserved moment once it is known (throttle/cluster.go),
// so they count from the send.
// It also checks that a released token whose moment has passed is not
// refunded after later takes (bucket_undo in lua/rules.lua).
func TestClusterReservedSendKeepsRecipientWindows(t *testing.T) {
	c := clusterRun(t, "rs", time.Second, 12, nil)
	t.Logf("cluster with reservations: sent twice: %d", c.dupTasks)
}
