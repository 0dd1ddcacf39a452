package jobs

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// A backlog on a slow provider books: each job is deferred once, to its
// moment, and goes then, in the order it booked, at the provider's pace.
// Not parallel: the pace is measured at the provider, and sends granted
// apart arrive bunched when the package's other tests keep the CPU busy.
func TestHandlerBooksABacklog(t *testing.T) {
	q, err := throttle.NewQuota("mkt", throttle.Window{Limit: 100, Per: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b, err := throttle.NewBucket("gw", 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, inlineWait: 2500 * time.Millisecond, book: true})
	const n = 16
	var ids []string
	for i := range n {
		id := fmt.Sprint("job", i)
		h.enqueue(t, id, message.Notification{Recipient: fmt.Sprint("r", i), Policy: "mkt", Provider: "gw", Template: "x"})
		ids = append(ids, id)
	}
	for _, id := range ids {
		h.await(t, id, "completed", state(asynq.TaskStateCompleted))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	runs := 0
	var sent []time.Time
	for _, id := range ids {
		runs += h.runs[id]
		sent = append(sent, h.sent[id])
		if h.sends[id] != 1 {
			t.Errorf("%s sent %d times", id, h.sends[id])
		}
	}
	// One run to book, one to go; a job whose moment came within the
	// inline wait went on its first. On a busy machine a job may also come
	// back before its tokens (told its moment again) or too late (booked
	// again): a run or two more. Polling would take about one run per job
	// per second of backlog (here 8 s).
	for _, id := range ids {
		if h.runs[id] > 5 {
			t.Errorf("%s ran %d times: it polled", id, h.runs[id])
		}
	}
	if runs > 3*n {
		t.Errorf("%d handler runs for %d jobs: more than two deferrals each on average", runs, n)
	}
	if runs < n+n/2 {
		t.Errorf("%d handler runs for %d jobs: the backlog did not book (this test is about booking)", runs, n)
	}
	slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
	least := time.Hour
	for i := 1; i < len(sent); i++ {
		// 2/s burst 1: 500 ms apart at the provider, less the time a send
		// can spend between its moment and the provider on a busy machine.
		gap := sent[i].Sub(sent[i-1])
		if gap < 500*time.Millisecond-150*time.Millisecond {
			t.Errorf("sends %d and %d arrived %s apart at a 2/s provider", i-1, i, gap)
		}
		least = min(least, gap)
	}
	t.Logf("%d jobs, %d handler runs, first to last send %s, sends at least %s apart", n, runs, sent[n-1].Sub(sent[0]), least.Round(time.Millisecond))
}

// TestBookingWorksAtAnyInlineWait runs a burst to a few recipients, whose
// windows bind, at inline waits of 0, 1 s and 2.5 s, with asynq waking
// deferred tasks as the worker has it (every second, on whole seconds): a
// booked job must claim its moment whatever the inline wait. When its claim
// window followed the inline wait, a job woken a second late (as asynq
// does) found its slot gone and booked again, and every other did too: at
// 1 s and 0 s almost nothing was sent.
func TestBookingWorksAtAnyInlineWait(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, time.Second, 2500 * time.Millisecond} {
		t.Run(fmt.Sprint(wait), func(t *testing.T) {
			t.Parallel()
			q, err := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Second}, throttle.Window{Limit: 3, Per: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// The worker's default margin (config worker.window_margin):
			// what keeps the windows at the provider when one send leaves
			// later than the next, as on this busy machine.
			if q, err = q.WithMargin(250 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
			b, err := throttle.NewBucket("gw", 1000, 100)
			if err != nil {
				t.Fatal(err)
			}
			// As the worker does with its margin: a send about to leave more
			// than half of it late takes the next moment (jobs/late.go).
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, inlineWait: wait, book: true, forwardEvery: time.Second, lateAfter: 125 * time.Millisecond})
			const recipients, each = 3, 5
			var ids []string
			for i := range each {
				for r := range recipients {
					id := fmt.Sprintf("r%d-%d", r, i)
					h.enqueue(t, id, message.Notification{Recipient: fmt.Sprint("r", r)})
					ids = append(ids, id)
				}
			}
			h.awaitAll(t, ids, 60*time.Second)
			h.mu.Lock()
			defer h.mu.Unlock()
			runs := 0
			for _, id := range ids {
				runs += h.runs[id]
			}
			// One run to book, one to claim; the first of each recipient
			// goes on its first. Booking again each time a job wakes late
			// took 10 to 40 runs a message.
			if perMessage := float64(runs) / float64(len(ids)); perMessage > 2.5 {
				t.Errorf("%.2f handler runs per message, want at most 2.5 (one booking, one claim)", perMessage)
			}
			for r := range recipients {
				var sent []time.Time
				for i := range each {
					sent = append(sent, h.sent[fmt.Sprintf("r%d-%d", r, i)])
				}
				slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
				// The rules themselves, at the provider: the margin absorbs
				// a send that leaves later than the next.
				const slop = 0
				for i := 1; i < len(sent); i++ {
					if gap := sent[i].Sub(sent[i-1]); gap < time.Second-slop {
						t.Errorf("r%d: sends %d and %d %s apart under 1 per second", r, i-1, i, gap)
					}
				}
				for i := 3; i < len(sent); i++ {
					if gap := sent[i].Sub(sent[i-3]); gap < 5*time.Second-slop {
						t.Errorf("r%d: sends %d..%d within %s under 3 per 5 s", r, i-3, i, gap)
					}
				}
			}
			t.Logf("inline wait %s: %d runs for %d messages", wait, runs, len(ids))
		})
	}
}
