package pipeline

import (
	"context"
	"flag"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The rate-change benchmark (issue 28): a provider's rate changed by SIGHUP
// while work waits on it, placed in line and booked, with the booking fleet
// of booking_test.go (2 workers at config.yaml's concurrency of 20, its
// booking settings, book_ahead its default of 5 s).

var (
	raisedJobs  = flag.Int("repace.raised", 52, "notifications of BenchmarkRateChange/raised (2/s, 3 sent, then 20/s)")
	loweredJobs = flag.Int("repace.lowered", 130, "notifications of BenchmarkRateChange/lowered (20/s, 30 sent, then 5/s)")
	pausedJobs  = flag.Int("repace.paused", 400, "notifications of BenchmarkRateChange/paused (20/s, the 61st arrival answered 429)")
	retryAfter  = flag.Int("repace.retryafter", 2, "the seconds of BenchmarkRateChange/paused's Retry-After")
	pausedRate  = flag.Float64("repace.pausedrate", 20, "the provider's rate in BenchmarkRateChange/paused (burst: a tenth, at least 2)")
)

// repacedLog is what the worker that re-paces a provider's waiting work
// logs (jobs.Throttle.Repace): one of the fleet does, the first to reach
// the bucket after the reload.
const repacedLog = "waiting work re-paced"

// BenchmarkRateChange measures how waiting work takes a provider's new rate
// when the config changes under a running fleet: every worker's config file
// rewritten and each sent SIGHUP, as an operator would. The policy never
// binds (each notification has its own recipient).
//
// raised: 52 notifications (-repace.raised) queued for a provider of 2/s
// burst 1; once the workers placed some in line and 3 arrived, the rate is
// raised to 20/s. Reported: the seconds from the reload to the last
// arrival, against what the rest takes at the new rate (left/20) and at
// the old (left/2); and the seconds until a worker logged the re-pacing.
//
// lowered: 130 notifications (-repace.lowered) for a provider of 20/s burst
// 2; once some were placed in line and 30 arrived (about 100 waiting), the
// rate is lowered to 5/s. Reported: the arrivals' excess over the new
// bucket (burst + rate·T in any interval T) after the change, counted from
// the reload and from 300 ms after it (a send that had passed its last check
// may still arrive just after); admission calls per message sent after the
// change (a backlog costs 2: its place, its send; a re-pace at most about
// one more); and the drain time against left/5.
//
// paused: 400 notifications (-repace.paused) for a provider of 20/s burst 2
// (-repace.pausedrate; burst a tenth of it) whose webhook answers the 61st
// request 429 with Retry-After: 2 (-repace.retryafter): the bucket pauses
// for the fleet, and every moment it holds ahead moves by the pause.
// Reported: arrivals in the 5 s after the pause's end against burst +
// 5·rate, the longest gap from its end, the drain time from it against
// left/rate, admission calls per message sent after the 429, rebookings.
//
// Each fails when a message is lost or arrives twice, or a worker delivers
// nothing or does not stop cleanly.
func BenchmarkRateChange(b *testing.B) {
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := buildWorker(b, root)
	b.Run("raised", func(b *testing.B) { rateChangeRun(b, bin, *raisedJobs, 2, 1, 3, 20) })
	b.Run("lowered", func(b *testing.B) { rateChangeRun(b, bin, *loweredJobs, 20, 2, 30, 5) })
	b.Run("paused", func(b *testing.B) {
		pauseRun(b, bin, *pausedJobs, *pausedRate, max(2, int(*pausedRate/10)), 61, *retryAfter)
	})
}

// pauseRun queues n notifications for a provider of rate and burst whose
// webhook answers the refuse-th arrival 429 with Retry-After: after
// seconds, and runs until every one arrived. Reported: how the provider
// resumes at the pause's end (arrivals in the 5 s after it against
// burst + 5·rate, the longest gap from it on), the drain time from it
// against left/rate, and what the pause cost in admission calls per
// message sent after it and in rebookings.
func pauseRun(b *testing.B, bin string, n int, rate float64, burst, refuse, after int) {
	ctx := context.Background()
	f := newBookFleet(b, bin)
	ids, err := enqueueJobs(ctx, f.client, n, "pause-")
	if err != nil {
		b.Fatal(err)
	}
	all := f.hook.expect(n)
	f.hook.mu.Lock()
	f.hook.refuse, f.hook.retryAfter = refuse, after
	f.hook.mu.Unlock()
	var s0 bookSnap
	f.start(b, bookConcurrency, backlogPolicy, rate, burst)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if _, total, _ := f.hook.arrivals(); total >= refuse-1 {
			s0 = f.snap(b)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after 1m: fewer than %d arrivals; worker logs:\n%s", refuse-1, workerLogs(f.ws))
		}
	}
	_, _, before := f.hook.arrivals()
	s1 := f.drain(b, all, n, time.Duration(float64(n)/rate*float64(time.Second))+time.Minute)
	distinct, total, _ := f.hook.arrivals()
	if distinct != n || total != n+1 {
		b.Fatalf("the webhook got %d requests (%d distinct messages), want %d once each and the one refused", total, distinct, n)
	}
	f.hook.mu.Lock()
	refused := f.hook.refused
	f.hook.mu.Unlock()
	end := refused.Add(time.Duration(after) * time.Second)
	arrived := arrivedOf(f.hook.firstArrivals(), ids)
	left := n - len(before)
	var during, first5 int
	var gap time.Duration // the longest without an arrival, from the pause's end on
	prev := end
	var last time.Time
	for _, t := range arrived {
		switch {
		case t.Before(refused) || !t.After(refused.Add(300*time.Millisecond)) && t.Before(end):
			// before the 429, or granted before it and still in flight
		case t.Before(end):
			during++
		default:
			if t.Before(end.Add(5 * time.Second)) {
				first5++
			}
			gap, prev, last = max(gap, t.Sub(prev)), t, t
		}
	}
	calls := (s1.sum("throttler_admission_seconds_count") - s0.sum("throttler_admission_seconds_count")) / float64(left)
	since := func(event string) float64 {
		name := `throttler_bookings_total{event="` + event + `"}`
		return s1.sum(name) - s0.sum(name)
	}
	drain := last.Sub(end)
	atRate := time.Duration(float64(left) / rate * float64(time.Second))
	b.Logf("%d queued for %g/s burst %d, arrival %d answered 429 Retry-After: %d with %d delivered; %d arrived during the pause more than 300 ms after the 429",
		n, rate, burst, refuse, after, len(before), during)
	b.Logf("from the pause's end: %d arrivals in 5 s (at %g/s burst %d: %d), the longest gap %s, the last %s after it (%d left: ~%s at %g/s)",
		first5, rate, burst, burst+int(5*rate), gap.Round(time.Millisecond), drain.Round(time.Millisecond), left, atRate.Round(100*time.Millisecond), rate)
	b.Logf("admission calls per message sent after the 429 %.2f (placed in line %.0f, bookings made %.0f, claimed %.0f, rebooked %.0f, claimed slots taken back %.0f since)",
		calls, since("queued"), since("made"), since("claimed"), since("rebooked"), since("bumped"))
	b.ReportMetric(float64(first5), "first_5s")
	b.ReportMetric(gap.Seconds(), "gap_s")
	b.ReportMetric(drain.Seconds(), "drain_s")
	b.ReportMetric(atRate.Seconds(), "left/rate_s")
	b.ReportMetric(calls, "admissions/msg")
	b.ReportMetric(since("rebooked"), "rebooked")
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(0, "B/op")
	b.ReportMetric(0, "allocs/op")
}

// rateChangeRun queues n notifications for a provider of rate and burst,
// waits until some are placed in line and sent arrived, changes the rate
// to to, and runs until every one arrived.
func rateChangeRun(b *testing.B, bin string, n int, rate float64, burst, sent int, to float64) {
	ctx := context.Background()
	f := newBookFleet(b, bin)
	ids, err := enqueueJobs(ctx, f.client, n, "repace-")
	if err != nil {
		b.Fatal(err)
	}
	all := f.hook.expect(n)
	f.start(b, bookConcurrency, backlogPolicy, rate, burst)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		got, _, _ := f.hook.arrivals()
		if got >= sent && f.snap(b).sum(`throttler_bookings_total{event="queued"}`) > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after 1m: %d of %d delivered, want %d and some placed in line; worker logs:\n%s", got, n, sent, workerLogs(f.ws))
		}
	}
	s0 := f.snap(b)
	_, _, before := f.hook.arrivals()
	at, logged, line := f.reload(b, to)
	left := n - len(before)
	s1 := f.drain(b, all, n, time.Duration(float64(n)/min(rate, to)*float64(time.Second))+time.Minute)
	distinct, total, _ := f.hook.arrivals()
	if distinct != n || total != n {
		b.Fatalf("the webhook got %d messages (%d distinct), want %d once each", total, distinct, n)
	}
	after := arrivedOf(f.hook.firstArrivals(), ids)
	after = after[len(after)-left:]
	last := after[len(after)-1].Sub(at)
	atNew := time.Duration(float64(left) / to * float64(time.Second))
	atOld := time.Duration(float64(left) / rate * float64(time.Second))
	calls := (s1.sum("throttler_admission_seconds_count") - s0.sum("throttler_admission_seconds_count")) / float64(left)
	over, _, _ := bucketOver(after, to, f.burst)
	var later []time.Time
	for _, t := range after {
		if !t.Before(at.Add(300 * time.Millisecond)) {
			later = append(later, t)
		}
	}
	overLater, _, _ := bucketOver(later, to, f.burst)
	var gap time.Duration // the longest without an arrival, from the reload on
	prev := at
	for _, t := range after {
		gap, prev = max(gap, t.Sub(prev)), t
	}
	paced := float64(len(after)-1) / after[len(after)-1].Sub(after[0]).Seconds()
	b.Logf("%d queued for %g/s burst %d, %d delivered when the rate changed to %g/s (a worker logged the re-pacing %s after the reload: %s)",
		n, rate, burst, len(before), to, logged.Sub(at).Round(time.Millisecond), line)
	since := func(event string) float64 {
		name := `throttler_bookings_total{event="` + event + `"}`
		return s1.sum(name) - s0.sum(name)
	}
	b.Logf("%d left: the last arrived %s after the reload; at the new rate ~%s, at the old ~%s; admission calls per message sent after it %.2f (placed in line %.0f, bookings made %.0f, claimed %.0f, rebooked %.0f, claimed slots taken back %.0f since)",
		left, last.Round(time.Millisecond), atNew.Round(100*time.Millisecond), atOld.Round(100*time.Millisecond), calls,
		since("queued"), since("made"), since("claimed"), since("rebooked"), since("bumped"))
	b.Logf("arrivals after the change: the first %s after the reload, %.2f/s from the first to the last, the longest gap %s; over the new bucket (%g/s burst %d): excess %.2f from the reload, %.2f from 300 ms after it",
		after[0].Sub(at).Round(time.Millisecond), paced, gap.Round(time.Millisecond), to, f.burst, max(over, 0), max(overLater, 0))
	b.ReportMetric(last.Seconds(), "drain_s")
	b.ReportMetric(atNew.Seconds(), "left/new_rate_s")
	b.ReportMetric(atOld.Seconds(), "left/old_rate_s")
	b.ReportMetric(calls, "admissions/msg")
	b.ReportMetric(paced, "after/s")
	b.ReportMetric(after[0].Sub(at).Seconds(), "first_s")
	b.ReportMetric(max(over, 0), "excess")
	b.ReportMetric(max(overLater, 0), "excess_after_300ms")
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(0, "B/op")
	b.ReportMetric(0, "allocs/op")
}

// drain waits until all (the webhook's expect(n)) closes, within timeout,
// and the queues are empty, and returns what the fleet had done then; it
// stops the workers, each cleanly, after checking that each delivered.
func (f *bookFleet) drain(b *testing.B, all <-chan struct{}, n int, timeout time.Duration) bookSnap {
	b.Helper()
	select {
	case <-all:
	case <-time.After(timeout):
		got, _, _ := f.hook.arrivals()
		b.Fatalf("%d of %d delivered in %s; worker logs:\n%s", got, n, timeout, workerLogs(f.ws))
	}
	if _, err := awaitEmpty(f.insp, 30*time.Second); err != nil {
		b.Fatalf("%v; worker logs:\n%s", err, workerLogs(f.ws))
	}
	s := f.snap(b)
	f.requireEachSent(b)
	f.stop(b)
	return s
}

// reload rewrites every worker's config with the provider's rate changed to
// rate and sends each SIGHUP. It returns when it sent the first, when a
// worker logged the re-pacing, and that line.
func (f *bookFleet) reload(b *testing.B, rate float64) (at, logged time.Time, line string) {
	b.Helper()
	f.rate = rate
	for _, w := range f.ws {
		if err := os.WriteFile(w.conf, []byte(f.config(w.metrics)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	at = time.Now()
	for _, w := range f.ws {
		if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			b.Fatalf("worker %d: SIGHUP: %v", w.n, err)
		}
	}
	for deadline := at.Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, w := range f.ws {
			raw, err := os.ReadFile(w.log)
			if err != nil {
				b.Fatal(err)
			}
			for _, l := range strings.Split(string(raw), "\n") {
				if strings.Contains(l, repacedLog) {
					return at, time.Now(), strings.TrimSpace(l)
				}
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("no %q in a worker's log 10 s after SIGHUP:\n%s", repacedLog, workerLogs(f.ws))
		}
	}
}
