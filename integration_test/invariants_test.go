//go:build integration

package integration_test

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The invariant checks shared by the end-to-end tests. Each is done twice:
//
//   - exactly, on the moments the throttle script granted (Redis time, from
//     the provider bucket's ledger), which is what the engine promises;
//   - on the arrival times at the webhook (this process's clock), which is
//     what a recipient and the provider see, with a tolerance for the time a
//     request spends between its granted moment and the webhook's handler.
//
// A send never starts before its granted moment, so two arrivals come
// closer than their grants only by the earlier one's lateness in flight
// (timers, the loopback round trip, goroutines waiting for a CPU).
// skewTolerance bounds that: measured p50 1-2 ms, p99 20-25 ms, single
// requests up to 340 ms on a shared 2-core machine (the tests log it as
// "arrival-granted skew"). The exact checks are on the grants; the arrival
// checks catch a send without, before or long after its grant, and must
// not fail on a busy machine.
const skewTolerance = 500 * time.Millisecond

// grantResolution is the precision of the granted moments themselves: the
// engine computes a reservation's wait in whole µs from a token count held
// in a double, so two moments can be 1 µs closer than the exact rate allows
// (seen: 3 grants within 1.999999 s of a 1/s, burst 1 bucket). The issue
// asks for millisecond precision or better; checking at 2 µs keeps the
// granted-moment checks exact to the engine's own resolution.
const grantResolution = 2 * time.Microsecond

// clockSlop allows for reading Redis's clock and this process's clock at
// slightly different moments: both are the host's CLOCK_REALTIME.
const clockSlop = 2 * time.Millisecond

// windowWorst returns, for times sorted ascending and a window allowing
// limit events per per, the smallest span t[i+limit] − t[i]: it must be at
// least per (an entry counts while it is less than per old), else limit+1
// events fell in one window. ok is false when there are at most limit times.
func windowWorst(times []time.Time, limit int) (worst time.Duration, at time.Time, ok bool) {
	for i := 0; i+limit < len(times); i++ {
		if d := times[i+limit].Sub(times[i]); !ok || d < worst {
			worst, at, ok = d, times[i], true
		}
	}
	return worst, at, ok
}

// checkWindows checks that in every recipient's sorted times no more than
// limit fall in any window of length per, allowing tol.
func checkWindows(t *testing.T, what string, byRecipient map[string][]time.Time, limit int, per, tol time.Duration) (closest time.Duration) {
	t.Helper()
	closest = -1
	for r, times := range byRecipient {
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		worst, at, ok := windowWorst(times, limit)
		if !ok {
			continue
		}
		if closest < 0 || worst < closest {
			closest = worst
		}
		if worst < per-tol {
			t.Errorf("%s: recipient %s got %d messages within %s (from %s), policy allows %d per %s (tolerance %s)",
				what, r, limit+1, worst, at.Format("15:04:05.000"), limit, per, tol)
		}
	}
	return closest
}

// bucketExcess returns the largest excess of arrivals over what a token
// bucket allows in any interval: max over i<j of
// (j−i+1) − burst − rate·(t[j]−t[i]) − extra(t[i], t[j]), for times sorted
// ascending. It must be ≤ 0 for the granted moments and ≤ rate·tol for
// arrivals. extra (nil: 0) allows for requests a known bug may add in an
// interval (see TestPipeline).
func bucketExcess(times []time.Time, rate float64, burst int, extra func(from, to time.Time) float64) (excess float64, from time.Time, count int, span time.Duration) {
	excess = -float64(burst)
	for i := range times {
		for j := i; j < len(times); j++ {
			d := times[j].Sub(times[i])
			e := float64(j-i+1) - float64(burst) - rate*d.Seconds()
			if e > excess && extra != nil {
				e -= extra(times[i], times[j])
			}
			if e > excess {
				excess, from, count, span = e, times[i], j-i+1, d
			}
		}
	}
	return excess, from, count, span
}

// checkBucket checks times against a token bucket with a tolerance: at
// most burst + rate·(T + tol) (+ extra) requests in any interval T.
func checkBucket(t *testing.T, what string, times []time.Time, rate float64, burst int, tol time.Duration, extra func(from, to time.Time) float64) float64 {
	t.Helper()
	times = slices.Clone(times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	excess, from, count, span := bucketExcess(times, rate, burst, extra)
	if excess > rate*tol.Seconds()+1e-6 {
		allowed := float64(burst) + rate*span.Seconds()
		if extra != nil {
			allowed += extra(from, from.Add(span))
		}
		t.Errorf("%s: %d requests within %s from %s; the bucket (%g/s, burst %d) allows %.2f (tolerance %s)",
			what, count, span, from.Format("15:04:05.000"), rate, burst, allowed, tol)
	}
	return excess
}

// maxRate returns the most requests seen in any window of length per.
func maxRate(times []time.Time, per time.Duration) int {
	times = slices.Clone(times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) >= per {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// skewSummary describes the measured arrival − granted moment lateness.
func skewSummary(skews []time.Duration) string {
	if len(skews) == 0 {
		return "no sends"
	}
	s := slices.Clone(skews)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[int(p*float64(len(s)-1))].Round(100 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s", q(0.5), q(0.9), q(0.99), q(1))
}
