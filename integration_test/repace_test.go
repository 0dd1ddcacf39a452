//go:build integration

package integration_test

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The rate-change tests: a provider's rate changed by SIGHUP while work
// waits on it, most of it placed in line past the horizon. The waiting work
// takes the new pace within a second or two: raised, it drains at the new
// rate instead of the old; lowered, the provider never gets more than the
// new bucket allows, and each waiting message costs at most about one
// admission more. Before, slots and places kept the pace they were handed
// out at: 52 waiting at 2/s raised to 20/s still went at 2/s (the last 24 s
// after the reload), and lowered 20/s to 2/s, 16 more than the new bucket
// allowed arrived after the change.

// repaceConfig is one worker that books 2 s ahead (so that a backlog is
// mostly placed in line), at config.yaml's concurrency; the policy never
// binds (each notification has its own recipient).
var repaceConfig = fleetConfig{
	Concurrency:     20,
	ShutdownTimeout: 5 * time.Second,
	InlineWait:      2500 * time.Millisecond,
	Jitter:          200 * time.Millisecond,
	Policy:          "[{limit: 1000, per: 1h}]",
	Book:            true,
	BookAhead:       2 * time.Second,
}

// changeRate rewrites w's config with the rate and sends it SIGHUP, and
// returns once it logged the re-pacing.
func (f *fleet) changeRate(w *workerProc, rate float64) time.Time {
	f.t.Helper()
	const logged = "waiting work re-paced"
	f.cfg.Rate = rate
	f.writeConfig(w.name, w.metrics)
	at := time.Now()
	if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		f.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(w.out.String(), logged); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			f.t.Fatalf("no %q in the worker's log after SIGHUP:\n%s", logged, tail(w.out.String(), 10))
		}
	}
	f.t.Logf("rate %g/s: %s", rate, tail(w.out.String(), 1))
	return at
}

// arrivalsAfter returns the first accepted arrival of each task at or after
// from, sorted.
func (f *fleet) arrivalsAfter(from time.Time) []time.Time {
	seen := map[string]bool{}
	var out []time.Time
	for _, a := range f.hook.snapshot() {
		if seen[a.Key] || a.Status < 200 || a.Status >= 300 {
			continue
		}
		seen[a.Key] = true
		if !a.At.Before(from) {
			out = append(out, a.At)
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

func TestRateChangeRepacesWaitingWork(t *testing.T) {
	t.Run("raised", func(t *testing.T) {
		cfg := repaceConfig
		cfg.Rate, cfg.Burst = 2, 1
		f := newFleet(t, cfg, nil)
		const n = 52
		notes, _ := f.enqueueTenants("up", []string{"t"}, n)
		w := f.startWorker("w1")
		waitFor(t, "the backlog placed in line and 3 sent", func() bool {
			return f.metricsOf(w)[`throttler_bookings_total{event="queued"}`] > 0 && len(f.hook.delivered()) >= 3
		})
		at := f.changeRate(w, 20)
		left := n - len(f.hook.delivered())
		f.waitAllEnded(60*time.Second, notes)
		f.stop(w)
		sentOnce(t, f, notes)
		after := f.arrivalsAfter(at)
		done := after[len(after)-1].Sub(at)
		// At 20/s the rest takes left/20 s; the slots booked before the
		// change (2 s ahead at most) and asynq's whole-second wake-ups add
		// a little. At the old pace it would take left/2 s.
		bound := time.Duration(float64(left)/20*float64(time.Second)) + cfg.BookAhead + 3*time.Second
		old := time.Duration(float64(left) / 2 * float64(time.Second))
		t.Logf("%d left at the change; the last sent %s after it (bound %s; at the old pace %s)", left, done.Round(time.Millisecond), bound, old)
		if done > bound {
			t.Errorf("the last of %d waiting messages went %s after the rate was raised to 20/s, want at most %s (at the old 2/s: %s)",
				left, done.Round(time.Millisecond), bound, old)
		}
		if e, from, c, span := bucketExcess(after, 20, 1, nil); e > 20*skewTolerance.Seconds()+0.01 {
			t.Errorf("after the change: %d arrivals within %s from %s, %.2f over 20/s burst 1", c, span, from.Format("15:04:05.000"), e)
		}
	})
	t.Run("lowered", func(t *testing.T) {
		cfg := repaceConfig
		cfg.Rate, cfg.Burst = 20, 2
		f := newFleet(t, cfg, nil)
		const n = 120
		notes, _ := f.enqueueTenants("down", []string{"t"}, n)
		w := f.startWorker("w1")
		waitFor(t, "the backlog placed in line and 30 sent", func() bool {
			return f.metricsOf(w)[`throttler_bookings_total{event="queued"}`] > 0 && len(f.hook.delivered()) >= 30
		})
		before := f.metricsOf(w)["throttler_admission_seconds_count"]
		at := f.changeRate(w, 5)
		sentAt := len(f.hook.delivered())
		f.waitAllEnded(90*time.Second, notes)
		calls := f.metricsOf(w)["throttler_admission_seconds_count"] - before
		f.stop(w)
		sentOnce(t, f, notes)
		// A send that had passed its last check before the change may
		// still arrive just after it.
		after := f.arrivalsAfter(at.Add(300 * time.Millisecond))
		if e, from, c, span := bucketExcess(after, 5, 2, nil); e > 5*skewTolerance.Seconds()+0.01 {
			t.Errorf("after the rate was lowered to 5/s: %d arrivals within %s from %s, %.2f over 5/s burst 2", c, span, from.Format("15:04:05.000"), e)
		}
		per := calls / float64(n-sentAt)
		t.Logf("%d sent after the change at %.2f admission calls each", n-sentAt, per)
		// A backlog costs 2 calls a message (its place, its send); the
		// change at most about one more.
		if per > 3.2 {
			t.Errorf("%.2f admission calls per message sent after the rate was lowered 4x, want at most about one more than a backlog's 2", per)
		}
	})
}

// sentOnce checks that every notification reached the webhook exactly once.
func sentOnce(t *testing.T, f *fleet, notes map[string]faultNote) {
	t.Helper()
	got := f.hook.delivered()
	for id, n := range notes {
		if got[id] != 1 {
			t.Errorf("task %s (%s) accepted %d times, want once", id, n.recipient, got[id])
		}
	}
}
