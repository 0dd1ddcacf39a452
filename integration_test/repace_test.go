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
	f.cfg.Rate = rate
	at := f.reload(w, "waiting work re-paced")
	f.t.Logf("rate %g/s: %s", rate, tail(w.out.String(), 1))
	return at
}

// reload rewrites w's config from f.cfg and sends it SIGHUP, waits until w
// logged logged, and returns the moment of that log line: the change took
// effect then, which on a busy machine can be a second after the signal.
func (f *fleet) reload(w *workerProc, logged string) time.Time {
	f.t.Helper()
	f.writeConfig(w.name, w.metrics)
	seen := len(w.out.String())
	if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		f.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(w.out.String()[seen:], "\n") {
			if !strings.Contains(line, logged) {
				continue
			}
			stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, stamp)
			if err != nil {
				f.t.Fatalf("no time in the worker's log line %q: %v", line, err)
			}
			return at
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no %q in the worker's log after SIGHUP:\n%s", logged, tail(w.out.String(), 10))
		}
	}
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
		// The slots claimed ahead at the change are freed, and their tasks
		// take them again from places where the slots were, not left busy
		// (scaled 4x) while their tasks join the line's end: the provider
		// goes on at its new rate at once. Before, it got 1 arrival in the
		// 5 s after the change; with the slots freed but no places, 15.
		early := 0
		for _, a := range after {
			if a.Before(at.Add(5300 * time.Millisecond)) {
				early++
			}
		}
		if early < 17 {
			t.Errorf("%d arrivals in the 5 s after the rate was lowered to 5/s, want at least 17 (at 5/s: 25): the provider idled", early)
		}
		per := calls / float64(n-sentAt)
		t.Logf("%d sent after the change at %.2f admission calls each, %d in the first 5 s", n-sentAt, per, early)
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

// TestWeightChangeRepacesWaitingLines: tenants a and b, equal weights, 200
// notifications each queued on a 20/s provider and placed in line; a's
// weight raised to 3 by SIGHUP, or in the config of a worker started after
// the first stopped. From shortly after the change a gets about three
// quarters of the rate: the lines already handed out are scaled to
// the new shares (jobs.Throttle.Reweigh). Without that, the places handed
// out at half the rate kept a near half the rate until they ran out.
func TestWeightChangeRepacesWaitingLines(t *testing.T) {
	t.Run("reload", func(t *testing.T) { weightChangeRun(t, false) })
	t.Run("restart", func(t *testing.T) { weightChangeRun(t, true) })
}

// weightChangeRun changes a's weight by SIGHUP, or (restart) in the config
// of a worker started after the first stopped, while no worker runs.
func weightChangeRun(t *testing.T, restart bool) {
	cfg := repaceConfig
	cfg.Rate, cfg.Burst = 20, 2
	f := newFleet(t, cfg, nil)
	const n = 200
	notes, tenantOf := f.enqueueTenants("weigh", []string{"a", "b"}, n)
	w := f.startWorker("w1")
	waitFor(t, "both lines placed and 2 s sent", func() bool {
		return f.metricsOf(w)[`throttler_bookings_total{event="queued"}`] > 0 && len(f.hook.delivered()) >= 40
	})
	f.cfg.Tenants = "\n  weights: {a: 3}\n"
	var at time.Time
	if restart {
		f.stop(w)
		at = time.Now()
		w = f.startWorker("w2")
		waitFor(t, "the new worker re-paced the lines", func() bool { return strings.Contains(w.out.String(), "waiting lines re-paced") })
	} else {
		at = f.reload(w, "waiting lines re-paced")
	}
	for _, line := range strings.Split(w.out.String(), "\n") {
		if strings.Contains(line, "waiting lines re-paced") {
			t.Logf("%s", line)
		}
	}
	// Counted from 3 s after the change (the slots booked before it, 2 s
	// ahead at most, and asynq's whole-second wake-ups) for 6 s, while both
	// still wait: a's 3/4 of 20/s is 90 there, b's 30.
	from, to := at.Add(3*time.Second), at.Add(9*time.Second)
	waitFor(t, "9 s after the change", func() bool { return time.Now().After(to) })
	by := f.arrivedBy(tenantOf)
	a, b := inWindow(by["a"], from, to), inWindow(by["b"], from, to)
	t.Logf("from 3 s to 9 s after the change: a %d, b %d (%.2f of the sends a's; weights 3:1 give 0.75, the old 1:1 0.5)", a, b, float64(a)/float64(a+b))
	if b == 0 || a+b < 80 {
		t.Fatalf("a %d and b %d sent in 6 s at 20/s: the window did not see both lines waiting", a, b)
	}
	// Without the re-pace a's share there was 0.65 (one run, by SIGHUP):
	// the gates of the tasks coming back to their places take the new
	// weight, the places do not. With it, 0.81.
	if share := float64(a) / float64(a+b); share < 0.70 || share > 0.88 {
		t.Errorf("a sent %d and b %d from 3 s to 9 s after a's weight went to 3: a's share %.2f, want about 0.75 (0.70 to 0.88)", a, b, share)
	}
	f.waitAllEnded(60*time.Second, notes)
	f.stop(w)
	sentOnce(t, f, notes)
}
