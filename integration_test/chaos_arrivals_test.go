//go:build integration

package integration_test

// What the provider saw in a chaos run, judged with no tolerance but for
// what the run itself provably caused. A send that would leave late takes
// the next moment instead (jobs' onTime), so a worker slow before a send
// breaks nothing; a SIGSTOP that lands after that check and before the
// request reaches the webhook delays the message by up to the stop, and no
// worker can see that. The run knows whom it stopped and when, and the
// webhook knows who sent each message (the X-Worker header the fleet's
// configs set), so such a delay is told apart from every other lateness:
// a recipient's messages closer than a window are excused only when the
// earlier of them was in flight from a stopped worker for at least the
// shortfall, and the provider's bucket exceeded only when moving such
// messages back by their stops leaves it whole. Everything else fails.

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// fault is a signal the run sent one worker process: SIGSTOP at from and
// SIGCONT at to, or SIGKILL at from (to is from). from is taken before the
// signal is sent and to after, so [from, to] covers the stop.
type fault struct {
	worker   string
	from, to time.Time
}

// landed is one message's first acceptance at the provider.
type landed struct {
	id     string
	worker string
	due    time.Time     // the moment it was granted: its send leaves after it
	at     time.Time     // its arrival
	held   time.Duration // how much of a stop of its sender lay in its flight (heldUp)
	by     fault         // that stop
}

// heldUp returns how long a stop of the worker that sent m lay between m's
// granted moment and its arrival at the provider, with the same process
// running throughout (not killed in between), and that stop. A message
// due before a SIGSTOP may have passed its late check and be on its way
// when the process stops; one due during the stop checks after SIGCONT
// and is admitted again if late. So the stop delayed m's arrival by at
// most the part of [from, to] after due, and only if m arrived after to.
func (c *chaos) heldUp(m landed) (held time.Duration, by fault) {
	for _, s := range c.stopped {
		if s.worker != m.worker || !m.due.Before(s.to) || m.at.Before(s.to) {
			continue
		}
		// The stop's part in the flight began at the later of the two; the
		// process had to be the same from the earlier on.
		first, inFlight := m.due, s.from
		if first.After(inFlight) {
			first, inFlight = inFlight, first
		}
		if d := s.to.Sub(inFlight); d > held && !c.killedBetween(m.worker, first, m.at) {
			held, by = d, s
		}
	}
	return held, by
}

// killedBetween reports whether worker was killed between from and to.
func (c *chaos) killedBetween(worker string, from, to time.Time) bool {
	return slices.ContainsFunc(c.killed, func(k fault) bool {
		return k.worker == worker && !k.from.Before(from) && !k.from.After(to)
	})
}

// landings returns each task's first acceptance at the provider by
// recipient, in arrival order, its granted moment from its quota entry
// (the ledger's slot when it has none) and how long a stop held it up.
func (c *chaos) landings(arrivals []arrival) map[string][]landed {
	ledger, entries := c.f.ledger(), c.f.quotaMoments()
	byRecipient, first := map[string][]landed{}, map[string]bool{}
	for _, a := range arrivals {
		if a.Status != http.StatusOK || first[a.Key] {
			continue
		}
		first[a.Key] = true
		m := landed{id: a.Key, worker: a.Worker, due: entryOr(entries, a.Key, ledger[a.Key]), at: a.At}
		m.held, m.by = c.heldUp(m)
		byRecipient[a.Recipient] = append(byRecipient[a.Recipient], m)
	}
	for _, ms := range byRecipient {
		slices.SortFunc(ms, func(a, b landed) int { return a.at.Compare(b.at) })
	}
	return byRecipient
}

// verdict counts what the arrival checks found: bounds broken beyond the
// tolerance, and of those the ones a stop provably caused.
type verdict struct {
	broken, excused int
}

// windowsAtArrival checks every recipient's arrivals against w, allowing
// tol (the stamping process's own stalls): w.limit+1 messages within less
// than w.per-tol fail the test unless the first of them, the late one, was
// held up by a stop of its sender for at least the shortfall. Each excused
// group is logged with its reason.
func (c *chaos) windowsAtArrival(t *testing.T, byRecipient map[string][]landed, w quotaWindow, tol time.Duration) verdict {
	t.Helper()
	var v verdict
	for r, ms := range byRecipient {
		for i := 0; i+w.limit < len(ms); i++ {
			early, last := ms[i], ms[i+w.limit]
			short := w.per - tol - last.at.Sub(early.at)
			if short <= 0 {
				continue
			}
			v.broken++
			pair := fmt.Sprintf("recipient %s: %d messages within %s (%d per %s; first %s from %s, granted %s, arrived %s; last %s from %s)",
				r, w.limit+1, last.at.Sub(early.at).Round(time.Millisecond), w.limit, w.per, early.id, early.worker,
				clock(early.due), clock(early.at), last.id, last.worker)
			if early.held < short {
				t.Errorf("at the provider: %s: %s short, %s", pair, short.Round(time.Millisecond), c.heldWhy(early))
				continue
			}
			v.excused++
			t.Logf("excused: %s: %s short, %s", pair, short.Round(time.Millisecond), c.heldWhy(early))
		}
	}
	return v
}

// bucketAtArrival checks every request at the provider against its bucket,
// allowing tol: an interval with more requests than the bucket allows fails
// the test unless moving each message held up by a stop back by that
// stop's part in its flight leaves the bucket whole; then the messages so
// moved within the interval are logged.
func (c *chaos) bucketAtArrival(t *testing.T, arrivals []arrival, byRecipient map[string][]landed, tol time.Duration) (v verdict, summary string) {
	t.Helper()
	held := map[string]landed{}
	for _, ms := range byRecipient {
		for _, m := range ms {
			held[m.id] = m
		}
	}
	var times, moved []time.Time
	for _, a := range arrivals {
		times = append(times, a.At)
		// Only a task's first acceptance has its granted moment; the
		// others stay where they arrived.
		if m, ok := held[a.Key]; ok && m.at.Equal(a.At) {
			moved = append(moved, a.At.Add(-m.held))
		} else {
			moved = append(moved, a.At)
		}
	}
	allowed := chaosRate * tol.Seconds()
	excess, from, n, span := bucketExcess(sortedTimes(times), chaosRate, chaosBurst, nil)
	summary = fmt.Sprintf("bucket exceeded by %.2f (%d requests in %s from %s)", excess, n, span.Round(time.Millisecond), clock(from))
	if excess <= allowed+1e-6 {
		return v, summary
	}
	v.broken++
	after, afterFrom, afterN, afterSpan := bucketExcess(sortedTimes(moved), chaosRate, chaosBurst, nil)
	if after > allowed+1e-6 {
		t.Errorf("at the provider: %s; with the messages a stop held up moved back by it, still %.2f (%d requests in %s from %s)",
			summary, after, afterN, afterSpan.Round(time.Millisecond), clock(afterFrom))
		return v, summary
	}
	v.excused++
	var why []string
	for _, m := range held {
		if m.held > 0 && !m.at.Before(from) && !m.at.After(from.Add(span)) {
			why = append(why, fmt.Sprintf("%s arrived %s, %s", m.id, clock(m.at), c.heldWhy(m)))
		}
	}
	slices.Sort(why)
	t.Logf("excused: %s, whole with the messages a stop held up moved back: %s", summary, strings.Join(why, "; "))
	return v, summary
}

// heldWhy says how a stop held m up, or that none did.
func (c *chaos) heldWhy(m landed) string {
	if m.held <= 0 {
		return "no stop of its sender lay in its flight"
	}
	return fmt.Sprintf("held up %s by %s's SIGSTOP %s–%s (%s in, %s long)", m.held.Round(time.Millisecond), m.by.worker,
		clock(m.by.from), clock(m.by.to), m.by.from.Sub(c.start).Round(time.Millisecond), m.by.to.Sub(m.by.from).Round(time.Millisecond))
}

// clock is t as a time of day to the millisecond.
func clock(t time.Time) string { return t.Format("15:04:05.000") }
