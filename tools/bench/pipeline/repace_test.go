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
	timeout := time.Duration(float64(n)/min(rate, to)*float64(time.Second)) + time.Minute
	select {
	case <-all:
	case <-time.After(timeout):
		got, _, _ := f.hook.arrivals()
		b.Fatalf("%d of %d delivered %s after the change; worker logs:\n%s", got, n, timeout, workerLogs(f.ws))
	}
	if _, err := awaitEmpty(f.insp, 30*time.Second); err != nil {
		b.Fatalf("%v; worker logs:\n%s", err, workerLogs(f.ws))
	}
	s1 := f.snap(b)
	f.requireEachSent(b)
	f.stop(b)
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
