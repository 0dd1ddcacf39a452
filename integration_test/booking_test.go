//go:build integration

package integration_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// The booking tests: worker binaries with config.yaml's booking settings
// (worker.book, the default, and inline_wait 2.5s: booked jobs wake up to
// 1.5 s early, claim their moment and sleep the rest) on a provider slower
// than the workers' slots, so that jobs book (slots > rate x inline_wait),
// and the invariants of checkRun on what arrived: every notification sent
// once, no recipient over a window, the provider never over its bucket,
// exactly on the granted moments and on arrivals.

// bookingConfig is a fleet that books: 2 workers of concurrency 8 (16 slots)
// against a provider of 4/s, whose inline wait of 2.5 s holds 10 jobs.
var bookingConfig = fleetConfig{
	Concurrency:     8,
	ShutdownTimeout: 5 * time.Second,
	InlineWait:      2500 * time.Millisecond,
	Jitter:          200 * time.Millisecond,
	Rate:            4,
	Burst:           2,
	Book:            true,
	// Every job books its slot (a ticket); the kill -9 and Redis restart
	// tests run again with placesAhead, where most jobs wait in line.
	BookAhead: time.Hour,
}

// placesAhead is a horizon (worker.book_ahead) past which jobs take a place
// in line rather than a ticket; longer than inline_wait (2.5 s), so that
// the jobs that come back from their places inside it still book tickets.
const placesAhead = 6 * time.Second

// withHorizons runs test once with bookingConfig's hour of tickets and once
// with placesAhead, where most jobs wait in line: their places are noted in
// their asynq task hashes, not in the provider's keys.
func withHorizons(t *testing.T, test func(t *testing.T, cfg fleetConfig)) {
	for _, h := range []struct {
		name  string
		ahead time.Duration
	}{{"tickets", bookingConfig.BookAhead}, {"places", placesAhead}} {
		t.Run(h.name, func(t *testing.T) {
			cfg := bookingConfig
			cfg.BookAhead = h.ahead
			test(t, cfg)
		})
	}
}

// sumOf is the sum of metric name's series (every label set) in m.
func sumOf(m map[string]float64, name string) float64 {
	sum := 0.0
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}

// bookingsOf returns the workers' bookings made, claimed and rebooked.
func bookingsOf(m map[string]float64) (made, claimed, rebooked float64) {
	return m[`throttler_bookings_total{event="made"}`], m[`throttler_bookings_total{event="claimed"}`],
		m[`throttler_bookings_total{event="rebooked"}`]
}

// requireBooked fails the test when no job booked: it would not test
// booking.
func requireBooked(t *testing.T, m map[string]float64) {
	t.Helper()
	made, claimed, rebooked := bookingsOf(m)
	t.Logf("bookings: made %g, claimed %g, rebooked %g; admission calls %g",
		made, claimed, rebooked, m["throttler_admission_seconds_count"])
	if made == 0 || claimed == 0 {
		t.Errorf("bookings made %g, claimed %g: no job booked and claimed its moment, so this run did not test booking", made, claimed)
	}
}

// TestBookingInvariants: a backlog of 48 notifications (16 recipients x 3)
// on a provider of 4/s burst 2 with recipient windows that bind (1 per 2 s,
// 2 per 6 s), 2 worker processes that book. Every notification is sent
// once; the windows and the bucket hold on the granted moments and on the
// arrivals (checkRun).
func TestBookingInvariants(t *testing.T) {
	cfg := bookingConfig
	cfg.Policy = "[{limit: 1, per: 2s}, {limit: 2, per: 6s}]"
	bookingInvariants(t, newFleet(t, cfg, nil))
}

// TestBookingCluster is TestBookingInvariants on a Redis Cluster of 3
// masters, where most recipients' quotas live on another node than the
// provider's bucket: a job books in a call per node (the bucket's, then the
// quotas' from that moment: throttle/cluster.go), and the same invariants
// hold on what arrived.
func TestBookingCluster(t *testing.T) {
	cfg := bookingConfig
	cfg.Policy = "[{limit: 1, per: 2s}, {limit: 2, per: 6s}]"
	bookingInvariants(t, newClusterFleet(t, 3, 0, cfg, nil))
}

// bookingInvariants runs TestBookingInvariants's backlog on fleet f, whose
// policy is 1 per 2 s and 2 per 6 s.
func bookingInvariants(t *testing.T, f *fleet) {
	windows := []quotaWindow{{1, 2 * time.Second}, {2, 6 * time.Second}}
	notes := f.enqueueNotes("book", 16, 3, 0, 0)
	ws := f.startWorkers("w1", "w2")
	start := time.Now()
	f.waitAllEnded(60*time.Second, notes)
	m := f.metricsOf(ws...)
	for _, w := range ws {
		f.stop(w)
	}
	t.Logf("settled %s after the start", time.Since(start).Round(100*time.Millisecond))
	t.Logf("%s", checkRun(t, f, notes, windows, false))
	requireBooked(t, m)
}

// TestBookingKill9: worker w1 books a backlog of 45 notifications on a
// provider of 3/s (burst 1), w2 joins, and w1 is killed with SIGKILL just
// after it claimed a booked moment, so that it dies holding that job asleep
// until its moment, and the rest of what it booked waits in asynq's retry
// set. The booked ones wake and are claimed by w2: a booking belongs to the
// task, not to the worker. The ones w1 held active come back through the
// fleet's hand-over (worker.dead_after, 5 s): a job that had claimed its
// moment finds its token in the ledger and goes without taking another.
// Every notification is sent, once unless w1 died in the second after it
// sent one; the windows and the bucket hold (checkRun). With places (a
// short horizon) the jobs w1 left in line are sent by w2, none before its
// place: a place, too, belongs to the task.
func TestBookingKill9(t *testing.T) { withHorizons(t, testBookingKill9) }

func testBookingKill9(t *testing.T, cfg fleetConfig) {
	cfg.Concurrency, cfg.Rate, cfg.Burst = 10, 3, 1
	cfg.Policy = "[{limit: 1, per: 1s}]"
	windows := []quotaWindow{{1, time.Second}}
	f := newFleet(t, cfg, nil)
	// A handed-over job that had claimed its moment before its worker died
	// more than a second ago gives its token back and claims again
	// (lua/book.lua, LATE): the bucket holds with no allowance, and none
	// goes more than a second after its granted moment.
	late := func(from, to time.Time) float64 {
		ledger := f.ledger()
		n := 0
		for _, a := range f.hook.snapshot() {
			if g, ok := ledger[a.Key]; ok && a.At.Sub(g) > time.Second && !a.At.Before(from) && !a.At.After(to) {
				n++
			}
		}
		return float64(n)
	}
	notes := f.enqueueNotes("bkill", 45, 1, 0, 0)
	w1 := f.startWorker("w1")
	// Booked: a slot (within book_ahead, 5 s: about 20 at 4/s) or, further
	// back, a place in line; both wait for w1's kill.
	waitFor(t, "w1 to book 20 jobs", func() bool {
		m := f.metricsOf(w1)
		made, _, _ := bookingsOf(m)
		return made+m[`throttler_bookings_total{event="queued"}`] >= 20
	})
	w2 := f.startWorker("w2")
	waitFor(t, "w2 to send", func() bool {
		for _, a := range f.hook.snapshot() {
			if a.Worker == "w2" {
				return true
			}
		}
		return false
	})
	claimedBy := func() float64 { _, c, _ := bookingsOf(f.metricsOf(w1)); return c }
	before := claimedBy()
	places := cfg.BookAhead < bookingConfig.BookAhead
	if places {
		// Few jobs hold tickets here (most wait in line, and w2 claims half
		// of the rest): w1 holds a slot as well when it sleeps until one it
		// was admitted for (admitted, not yet sent).
		inFlight := func() bool {
			m := f.metricsOf(w1)
			return sumOf(m, "throttler_admitted_total") > sumOf(m, "throttler_sent_total")
		}
		waitFor(t, "w1 to claim a booked moment or sleep until its slot", func() bool { return claimedBy() > before || inFlight() })
	} else {
		waitFor(t, "w1 to claim a booked moment", func() bool { return claimedBy() > before })
	}
	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	inLine := f.placesInLine()
	if places && len(inLine) == 0 {
		t.Errorf("no job waited in line when w1 was killed: this run did not test places")
	}
	if !w1.wait(10 * time.Second) {
		t.Fatal("w1 still running 10 s after SIGKILL")
	}
	killed := time.Now()
	// w1's sends of its last second: it may have died after the provider
	// took one and before it marked the task sent.
	lastSends := map[string]bool{}
	for _, a := range f.hook.snapshot() {
		if a.Worker == "w1" && a.At.After(killed.Add(-time.Second)) {
			lastSends[a.Key] = true
		}
	}
	q := f.queueState()
	t.Logf("killed w1: queue %d active, %d in retry (booked), %d pending; %d delivered, %d by w1 in its last second",
		q.Active, q.Retry, q.Pending, len(f.hook.delivered()), len(lastSends))
	f.waitAllEnded(60*time.Second, notes)
	m := f.metricsOf(w2)
	f.stop(w2)
	handed := sumOf(m, "throttler_recovered_tasks_total")
	t.Logf("settled %s after the kill; w2 took over %g of w1's tasks", time.Since(killed).Round(100*time.Millisecond), handed)
	c := checkRun(t, f, notes, windows, true)
	t.Logf("%s; sent more than a second after the granted moment: %g", c, late(killed.Add(-time.Hour), time.Now()))
	for _, id := range c.dups {
		if !lastSends[id] {
			t.Errorf("task %s was sent twice, and w1 had not sent it in the second before it died", id)
		}
	}
	if !places {
		// w1 booked (above); w2 claimed what it had booked.
		if _, claimed, _ := bookingsOf(m); claimed == 0 {
			t.Errorf("w2 claimed no booked moment")
		}
		return
	}
	// Here w1's tickets may all have been claimed before it died (a job back
	// from its place takes a slot within inline_wait: no ticket). What it
	// left in line keeps its place: w2 sends each no earlier than its place
	// less the bucket's slack (burst - 1 over the rate).
	slack := time.Duration(float64(cfg.Burst-1)/cfg.Rate*float64(time.Second)) + 20*time.Millisecond
	sent := map[string]arrival{}
	for _, a := range f.hook.snapshot() {
		sent[a.Key] = a
	}
	for id, place := range inLine {
		a, ok := sent[id]
		switch {
		case !ok:
			t.Errorf("task %s, in line for %s when w1 died, was not sent", id, place.Format("15:04:05.000"))
		case a.Worker != "w2":
			t.Errorf("task %s, in line when w1 died, was sent by %s", id, a.Worker)
		case a.At.Before(place.Add(-slack)):
			t.Errorf("task %s, in line for %s when w1 died, was sent %s before its place", id, place.Format("15:04:05.000"), place.Sub(a.At))
		}
	}
	t.Logf("%d jobs in line when w1 died went from their places", len(inLine))
}

// placesInLine returns the tasks waiting in asynq's retry set for their
// place in line (past the horizon) and each one's place: the moment the
// task comes back for it, its retry score (the task keeps its place: see
// docs/booking.md).
func (f *fleet) placesInLine() map[string]time.Time {
	f.t.Helper()
	ts, err := f.insp.ListRetryTasks(fleetQueue, asynq.PageSize(1000))
	if err != nil {
		f.t.Fatalf("list retry: %v", err)
	}
	got := map[string]time.Time{}
	for _, ti := range ts {
		if !strings.HasPrefix(ti.LastErr, "in line for") {
			continue
		}
		got[ti.ID] = ti.NextProcessAt
	}
	return got
}

// TestBookingRedisRestart: 2 workers book a backlog of 48 notifications (16
// recipients x 3, windows that bind) through a persisting redis-server
// (appendfsync always), which is killed with SIGKILL mid-run and started
// again a second later: the bookings (tickets, booked quota entries, the
// tasks in asynq's retry set) are on disk, and the workers claim them when
// Redis is back. Jobs that failed while Redis was down are run at once
// (their backoff is asynq's, not booking's). Every notification is sent;
// the windows and the bucket hold (checkRun). A job whose completion Redis
// refused while down may be sent again (see TestRedisRestartMidRun): those
// are counted, and must be at most the jobs in flight.
func TestBookingRedisRestart(t *testing.T) { withHorizons(t, testBookingRedisRestart) }

func testBookingRedisRestart(t *testing.T, cfg fleetConfig) {
	cfg.Policy = "[{limit: 1, per: 2s}, {limit: 2, per: 6s}]"
	windows := []quotaWindow{{1, 2 * time.Second}, {2, 6 * time.Second}}
	cfg.Durable = true
	f := newFleet(t, cfg, nil)
	notes := f.enqueueNotes("brestart", 16, 3, 0, 0)
	ws := f.startWorkers("w1", "w2")
	total := func() int { return len(f.hook.delivered()) }
	waitFor(t, "15 delivered", func() bool { return total() >= 15 })
	booked, err := f.rdb.ZCard(context.Background(), bookKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	placed := 0
	if ts, err := f.insp.ListRetryTasks(fleetQueue, asynq.PageSize(1000)); err == nil {
		for _, ti := range ts {
			if strings.HasPrefix(ti.LastErr, "in line for") {
				placed++
			}
		}
	}
	f.redis.Kill()
	killed, atKill := time.Now(), total()
	time.Sleep(time.Second) // the outage's length is what is under test
	f.redis.Restart(t)
	t.Logf("redis-server killed with %d delivered, %d jobs booked on the provider and %d in line, back after %s",
		atKill, booked, placed, time.Since(killed).Round(10*time.Millisecond))
	if booked+int64(placed) == 0 {
		t.Errorf("no booking or place held at the kill: the restart did not test bookings")
	}
	runRetries := func() {
		ts, err := f.insp.ListRetryTasks(fleetQueue, asynq.PageSize(1000))
		if err != nil {
			return
		}
		for _, ti := range ts {
			if !strings.HasPrefix(ti.LastErr, "booked for") && !strings.HasPrefix(ti.LastErr, "in line for") &&
				!strings.HasPrefix(ti.LastErr, "throttled by") {
				_ = f.insp.RunTask(fleetQueue, ti.ID)
			}
		}
	}
	// Settled: every notification sent, nothing pending, scheduled or in
	// retry. A task whose completion failed while Redis was down stays
	// active until asynq's lease recovery (see TestRedisRestartMidRun): it
	// was sent, which is what is required here.
	deadline := time.Now().Add(60 * time.Second)
	for {
		runRetries()
		q := f.queueState()
		if total() >= len(notes) && q.Pending+q.Scheduled+q.Retry == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled 60 s after the restart: %+v; %d of %d delivered", q, total(), len(notes))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, w := range ws {
		select {
		case <-w.done:
			t.Fatalf("worker %s exited: %v\n%s", w.name, w.err, tail(w.out.String(), 30))
		default:
		}
	}
	m := f.metricsOf(ws...)
	for _, w := range ws {
		f.stop(w)
	}
	c := checkRun(t, f, notes, windows, true)
	t.Logf("%s; settled %s after the restart", c, time.Since(killed).Round(100*time.Millisecond))
	if c.dupTasks > 2*cfg.Concurrency {
		t.Errorf("%d tasks sent twice: more than the %d the two workers could have had in flight at the kill", c.dupTasks, 2*cfg.Concurrency)
	}
	requireBooked(t, m)
}

// bookKey is the provider bucket's bookings (tickets):
// <prefix>{<provider>}:b:<provider>:book (internal/keyspace).
const bookKey = fleetPrefix + "{" + fleetProvider + "}:b:" + fleetProvider + ":book"
