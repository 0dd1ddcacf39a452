//go:build integration

package integration_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/message"
)

// The fair-share tests: tenants (senders) sharing one provider, through the
// built binaries. A tenant's notifications name it (the JSONL field tenant);
// while several tenants wait on the provider each gets its share of the rate,
// weighted by tenants.weights, and a tenant that starts waiting behind
// another's backlog gets its share within the provider's horizon
// (worker.book_ahead), not after the backlog. Every run also meets checkRun's
// invariants: each notification sent once, the provider never over its
// bucket on the granted moments and on arrivals.

// fairConfig is a fleet whose jobs book: 2 workers of concurrency 40 (80
// slots, more than rate x inline_wait = 50, so that a backlog is booked and
// placed in line rather than waited for inline) against a provider of 20/s
// burst 2 that books 3 s ahead. The policy never binds: each notification
// has its own recipient.
var fairConfig = fleetConfig{
	Concurrency:     40,
	ShutdownTimeout: 5 * time.Second,
	InlineWait:      2500 * time.Millisecond,
	Jitter:          200 * time.Millisecond,
	Policy:          "[{limit: 1000, per: 1h}]",
	Rate:            20,
	Burst:           2,
	Book:            true,
	BookAhead:       3 * time.Second,
}

// fairSlack is what a tenant's completion may take beyond its share's time
// and the horizon: asynq's whole-second wake-ups and forwarder (up to a
// second late), the enqueue command, a busy machine.
const fairSlack = 4 * time.Second

// enqueueTenants puts per notifications of each tenant on the queue with the
// enqueue binary (a JSONL file, tenant-interleaved: every tenant has work
// from the start), each to its own recipient. It returns them by task ID,
// and each one's tenant.
func (f *fleet) enqueueTenants(tag string, tenants []string, per int) (map[string]faultNote, map[string]string) {
	f.t.Helper()
	notes, tenantOf := map[string]faultNote{}, map[string]string{}
	var lines []jsonlLine
	for k := range per {
		for i, tenant := range tenants {
			l := jsonlLine{
				Recipient:      fmt.Sprintf("%s%04d-%d@example.com", tag, i, k),
				Template:       "news",
				IdempotencyKey: fmt.Sprintf("%s-%04d-%d", tag, i, k),
				Tenant:         tenant,
			}
			id := message.TaskID(l.IdempotencyKey)
			notes[id] = faultNote{id: id, recipient: l.Recipient, template: l.Template}
			tenantOf[id] = tenant
			lines = append(lines, l)
		}
	}
	f.enqueueFile(tag, lines)
	return notes, tenantOf
}

// arrivedBy returns the first accepted arrival of every task, sorted, by
// tenant.
func (f *fleet) arrivedBy(tenantOf map[string]string) map[string][]time.Time {
	seen, by := map[string]bool{}, map[string][]time.Time{}
	for _, a := range f.hook.snapshot() {
		if seen[a.Key] || a.Status < 200 || a.Status >= 300 {
			continue
		}
		seen[a.Key] = true
		by[tenantOf[a.Key]] = append(by[tenantOf[a.Key]], a.At)
	}
	for _, ts := range by {
		slices.SortFunc(ts, time.Time.Compare)
	}
	return by
}

// fairKeysGone waits until the provider's tenant records (its fair hash and
// the tenants' expiry set) are gone: a tenant's record goes once it has
// nothing waiting, so none stays once every notification was sent.
func (f *fleet) fairKeysGone(timeout time.Duration) {
	f.t.Helper()
	keys := []string{fairKey, tenantsKey}
	deadline := time.Now().Add(timeout)
	for {
		n, err := f.rdb.Exists(f.t.Context(), keys...).Result()
		if err != nil {
			f.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			hlen := f.rdb.HLen(f.t.Context(), keys[0]).Val()
			ttl := f.rdb.PTTL(f.t.Context(), keys[0]).Val()
			f.t.Errorf("the provider's tenant records are still there %s after the last send: %s holds %d fields (expires in %s)",
				timeout, keys[0], hlen, ttl)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The provider bucket's tenant records (internal/keyspace): each waiting
// tenant's line, gate and weight, and when each stops waiting.
const (
	fairKey    = fleetPrefix + "{" + fleetProvider + "}:b:" + fleetProvider + ":fair"
	tenantsKey = fleetPrefix + "{" + fleetProvider + "}:b:" + fleetProvider + ":tenants"
)

// shareRun is a run of a big sender queued first and a small one enqueued
// once the big one's backlog is booked and placed in line: what the test
// asserts on.
type shareRun struct {
	f                      *fleet
	smallAt                time.Time // when the small sender's enqueue started
	bigLeft                int       // big's messages not yet delivered then
	big, small             []time.Time
	overlapFrom, overlapTo time.Time // small's first and last arrival
	bigRate, smallRate     float64   // messages/s within the overlap
	metrics                map[string]float64
}

// runShare queues nBig notifications of tenant "big", starts two workers
// with cfg, waits until big's backlog reaches past the horizon (jobs placed
// in line) and 2 s of sends went out, then enqueues nSmall of tenant
// "small", and runs until every one was sent. It checks checkRun's
// invariants and that the tenants' records go once nothing waits.
func runShare(t *testing.T, cfg fleetConfig, nBig, nSmall int) shareRun {
	return runShareOn(t, newFleet(t, cfg, nil), nBig, nSmall)
}

// runShareOn is runShare on fleet f (a cluster fleet, say).
func runShareOn(t *testing.T, f *fleet, nBig, nSmall int) shareRun {
	cfg := f.cfg
	notes, tenantOf := f.enqueueTenants("big", []string{"big"}, nBig)
	ws := f.startWorkers("w1", "w2")
	waitFor(t, "big's backlog placed in line and 2 s of it sent", func() bool {
		m := f.metricsOf(ws...)
		return m[`throttler_bookings_total{event="queued"}`] > 0 && len(f.hook.delivered()) >= int(2*cfg.Rate)
	})
	r := shareRun{f: f, smallAt: time.Now()}
	r.bigLeft = nBig - len(f.hook.delivered())
	small, smallOf := f.enqueueTenants("small", []string{"small"}, nSmall)
	maps.Copy(notes, small)
	maps.Copy(tenantOf, smallOf)
	f.waitAllEnded(time.Duration(float64(nBig+nSmall)/cfg.Rate*float64(time.Second))+60*time.Second, notes)
	r.metrics = f.metricsOf(ws...)
	for _, w := range ws {
		f.stop(w)
	}
	t.Logf("%s", checkRun(t, f, notes, nil, false))
	made, claimed, rebooked := bookingsOf(r.metrics)
	t.Logf("bookings: made %g, queued %g, claimed %g, rebooked %g; admission calls %g",
		made, r.metrics[`throttler_bookings_total{event="queued"}`], claimed, rebooked, r.metrics["throttler_admission_seconds_count"])
	f.fairKeysGone(10 * time.Second)

	by := f.arrivedBy(tenantOf)
	r.big, r.small = by["big"], by["small"]
	if len(r.small) != nSmall || len(r.big) != nBig {
		t.Fatalf("arrived: big %d of %d, small %d of %d", len(r.big), nBig, len(r.small), nSmall)
	}
	r.overlapFrom, r.overlapTo = r.small[0], r.small[nSmall-1]
	span := r.overlapTo.Sub(r.overlapFrom).Seconds()
	// Both counted over [first, last): small's nSmall-1 gaps.
	r.smallRate = float64(nSmall-1) / span
	r.bigRate = float64(inWindow(r.big, r.overlapFrom, r.overlapTo)) / span
	t.Logf("small enqueued %s after big's first arrival with %d of big's %d left; small's %d arrived from %s to %s after its enqueue: small %.2f/s, big %.2f/s meanwhile; big's last %s after small's enqueue",
		r.smallAt.Sub(r.big[0]).Round(time.Millisecond), r.bigLeft, nBig, nSmall,
		r.overlapFrom.Sub(r.smallAt).Round(time.Millisecond), r.overlapTo.Sub(r.smallAt).Round(time.Millisecond),
		r.smallRate, r.bigRate, r.big[nBig-1].Sub(r.smallAt).Round(time.Millisecond))
	if !r.big[nBig-1].After(r.overlapTo.Add(time.Second)) {
		t.Fatalf("big's last message arrived %s, not after small's last (%s): the senders did not both wait, so this run tested no share",
			r.big[nBig-1].Format("15:04:05.000"), r.overlapTo.Format("15:04:05.000"))
	}
	return r
}

// inWindow counts the sorted times in [from, to).
func inWindow(times []time.Time, from, to time.Time) int {
	i, _ := slices.BinarySearchFunc(times, from, time.Time.Compare)
	j, _ := slices.BinarySearchFunc(times, to, time.Time.Compare)
	return j - i
}

// TestFairShareSmallBehindBig: 600 notifications of tenant big are queued
// first (30 s of the provider's 20/s); once the workers have placed big's
// backlog in line and sent 2 s of it, nSmall of tenant small are enqueued.
// Small gets half the rate at once: its last message arrives within its
// share's time plus the horizon (big's slots already booked) and
// fairSlack, where arrival order would have sent it after big's remaining
// backlog. While both wait, each gets about half the rate.
//
// At config.yaml's concurrency (2 workers of 20, fewer than rate x
// inline_wait = 50) every job of big's backlog found a slot within
// inline_wait and slept for it: nothing was placed in line, small's went
// after all of big's (144 s behind 3,000). Now a job that cannot go at once
// while work waits unseen in the queue takes a place (throttle.Booking.Backlog).
func TestFairShareSmallBehindBig(t *testing.T) {
	const nBig = 600
	for _, c := range []struct {
		name        string
		concurrency int
		burst       int
		bookAhead   time.Duration
		nSmall      int
	}{
		{"concurrency 20 burst 20 (config.yaml)", 20, 20, 5 * time.Second, 100},
		{"concurrency 20 burst 2", 20, 2, 5 * time.Second, 100},
		{"concurrency 40 burst 2", 40, 2, 3 * time.Second, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := fairConfig
			cfg.ACL = true // tenants' gates and lines, as config.yaml's user
			cfg.Concurrency, cfg.Burst, cfg.BookAhead = c.concurrency, c.burst, c.bookAhead
			r := runShare(t, cfg, nBig, c.nSmall)
			share := cfg.Rate / 2
			fair := time.Duration(float64(c.nSmall)/share*float64(time.Second)) + cfg.BookAhead + fairSlack
			fifo := time.Duration(float64(r.bigLeft+c.nSmall-cfg.Burst) / cfg.Rate * float64(time.Second))
			if fair > fifo*3/4 {
				t.Fatalf("the test cannot tell a share from arrival order: small's bound %s is near what arrival order gives (%s)", fair, fifo)
			}
			done := r.overlapTo.Sub(r.smallAt)
			t.Logf("small's last message %s after its enqueue: its share allows %s, arrival order would give %s", done.Round(time.Millisecond), fair, fifo.Round(time.Millisecond))
			if done > fair {
				t.Errorf("small's last message arrived %s after its enqueue, want at most %s (%d at half of %g/s, + book_ahead %s + %s); arrival order would give %s",
					done.Round(time.Millisecond), fair, c.nSmall, cfg.Rate, cfg.BookAhead, fairSlack, fifo.Round(time.Millisecond))
			}
			for _, s := range []struct {
				who  string
				rate float64
			}{{"small", r.smallRate}, {"big", r.bigRate}} {
				if s.rate < 0.35*cfg.Rate || s.rate > 0.65*cfg.Rate {
					t.Errorf("%s sent %.2f/s while both waited, want about half of %g/s (0.35 to 0.65 of it)", s.who, s.rate, cfg.Rate)
				}
			}
		})
	}
}

// TestFairShareCluster is TestFairShareSmallBehindBig on a Redis Cluster
// of 3 masters, where each recipient's quota and the provider's bucket are
// on different nodes (the three-call path): small still gets its share at
// once.
func TestFairShareCluster(t *testing.T) {
	const nBig, nSmall = 600, 50
	cfg := fairConfig
	r := runShareOn(t, newClusterFleet(t, 3, 0, cfg, nil), nBig, nSmall)
	share := cfg.Rate / 2
	fair := time.Duration(float64(nSmall)/share*float64(time.Second)) + cfg.BookAhead + fairSlack
	done := r.overlapTo.Sub(r.smallAt)
	t.Logf("small's last message %s after its enqueue: its share allows %s", done.Round(time.Millisecond), fair)
	if done > fair {
		t.Errorf("small's last message arrived %s after its enqueue, want at most %s (%d at half of %g/s, + book_ahead %s + %s)",
			done.Round(time.Millisecond), fair, nSmall, cfg.Rate, cfg.BookAhead, fairSlack)
	}
	// Equal shares: the rates' ratio, not their sum, which a cluster of
	// three masters and two workers on a loaded 2-core machine may not
	// bring to the provider's rate (seen: 11.4/s of 20 during make test).
	if ratio := r.smallRate / r.bigRate; ratio < 0.6 || ratio > 1.67 {
		t.Errorf("small %.2f/s and big %.2f/s while both waited (%.2f:1), want about equal shares", r.smallRate, r.bigRate, ratio)
	}
	if q := r.metrics[`throttler_bookings_total{event="queued"}`]; q < nBig/2 {
		t.Errorf("%g bookings placed in line of %d queued first: the horizon did not hold on the cluster", q, nBig)
	}
}

// TestFairShareWeighted is the weighted variant: tenants.weights {big: 2}
// gives big two thirds of the rate and small one third while both wait. 60
// of small take 9 s at 20/3 per second.
func TestFairShareWeighted(t *testing.T) {
	const nBig, nSmall = 600, 60
	cfg := fairConfig
	cfg.Tenants = "\n  weights: {big: 2}\n"
	r := runShare(t, cfg, nBig, nSmall)
	ratio := r.bigRate / r.smallRate
	t.Logf("big:small = %.2f while both waited (weights 2:1)", ratio)
	if ratio < 1.5 || ratio > 2.6 {
		t.Errorf("big sent %.2f/s and small %.2f/s while both waited: %.2f:1, want about 2:1 (1.5 to 2.6)", r.bigRate, r.smallRate, ratio)
	}
	fair := time.Duration(float64(nSmall)/(cfg.Rate/3)*float64(time.Second)) + cfg.BookAhead + fairSlack
	if done := r.overlapTo.Sub(r.smallAt); done > fair {
		t.Errorf("small's last message arrived %s after its enqueue, want at most %s (%d at a third of %g/s, + book_ahead %s + %s)",
			done.Round(time.Millisecond), fair, nSmall, cfg.Rate, cfg.BookAhead, fairSlack)
	}
}

// TestFairShareThousandTenants: 1,000 tenants, 2 notifications each, queued
// at once on a provider of 100/s (burst 10) by workers that book. Every
// notification is sent once, the bucket holds on the granted moments and on
// arrivals (checkRun), and the tenants' records go once nothing waits.
func TestFairShareThousandTenants(t *testing.T) {
	const tenants, per = 1000, 2
	cfg := fairConfig
	cfg.Concurrency, cfg.InlineWait, cfg.Rate, cfg.Burst = 100, 1500*time.Millisecond, 100, 10
	f := newFleet(t, cfg, nil)
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant%04d", i)
	}
	notes, _ := f.enqueueTenants("many", names, per)
	ws := f.startWorkers("w1", "w2")
	start := time.Now()
	f.waitAllEnded(150*time.Second, notes)
	m := f.metricsOf(ws...)
	for _, w := range ws {
		f.stop(w)
	}
	t.Logf("%d notifications of %d tenants settled %s after the start (%.1f/s; the provider's %g/s)",
		len(notes), tenants, time.Since(start).Round(100*time.Millisecond), float64(len(notes))/time.Since(start).Seconds(), cfg.Rate)
	t.Logf("%s", checkRun(t, f, notes, nil, false))
	requireBooked(t, m)
	t.Logf("bookings queued (placed in line): %g", m[`throttler_bookings_total{event="queued"}`])
	// A tenant's record goes a second after the later of its last place and
	// its gate, which a slot taken moves one stride on: tenants x a slot,
	// here 10 s. Seen gone 10.1 s after the last send.
	stride := time.Duration(float64(tenants) / cfg.Rate * float64(time.Second))
	f.fairKeysGone(stride + 6*time.Second)
}
