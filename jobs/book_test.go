package jobs

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"

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
		h.enqueue(t, id, Notification{Recipient: fmt.Sprint("r", i), Policy: "mkt", Provider: "gw", Template: "x"})
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
