//go:build integration

package integration_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestScheduledSend: notifications the enqueue binary schedules seconds
// ahead (send_at, and send_at_local as the time of day in UTC) wait in
// asynq's schedule, taking nothing of the throttle, and the worker binary
// sends them at their moment, not before, with every rule counted from
// then: the provider's pace spaces them from the moment, and their policy's
// max_delay (shorter than the wait) counts from it rather than from when
// they were queued.
func TestScheduledSend(t *testing.T) {
	bin := buildBinary(t, "enqueue")
	f := newFleet(t, fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: 2500 * time.Millisecond,
		Policy: "{windows: [{limit: 5, per: 1h}], over_cap: defer, max_delay: 4s}",
		Rate:   2, Burst: 1, Book: true,
	}, nil)
	cfg := f.writeConfig("enqueue", "")
	w := f.startWorker("w1")

	at := time.Now().Add(6 * time.Second).UTC().Truncate(time.Second) // max_delay before it: counted from queued, all would expire
	in := fmt.Sprintf(`{"recipient":"a@example.com","template":"news","send_at":%q,"idempotency_key":"at-a"}
{"recipient":"b@example.com","template":"news","send_at":%q,"idempotency_key":"at-b"}
{"recipient":"c@example.com","template":"news","send_at_local":%q,"tz":"UTC","idempotency_key":"at-c"}
`, at.Format(time.RFC3339), at.Format(time.RFC3339), at.Format("15:04:05"))
	_, stderr, code := runCommand(t, f.dir, strings.NewReader(in), bin, "-config", cfg, "-file", "-")
	if code != 0 || stderr != "enqueued 3, duplicates 0, rejected 0 (3 lines)\n" {
		t.Fatalf("enqueue: exit %d, stderr %q", code, stderr)
	}
	if time.Now().After(at.Add(-time.Second)) {
		t.Fatalf("enqueued within a second of the moment: too slow to see them wait")
	}
	scheduled, err := f.insp.ListScheduledTasks(fleetQueue)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range scheduled {
		if !ti.NextProcessAt.Equal(at) {
			t.Errorf("%s scheduled for %s, want %s", ti.ID, ti.NextProcessAt, at)
		}
	}
	if q := f.queueState(); len(scheduled) != 3 || q.Pending+q.Retry != 0 {
		t.Errorf("%d scheduled, %d pending, %d waiting; want the 3 scheduled", len(scheduled), q.Pending, q.Retry)
	}
	if l, m := f.ledger(), f.quotaMoments(); len(l) != 0 || len(m) != 0 {
		t.Errorf("before the moment the provider's ledger holds %v and the quotas %v: want nothing taken", l, m)
	}

	f.waitSettled(30*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 3 })
	f.stop(w)
	got := f.hook.snapshot()
	slices.SortFunc(got, func(a, b arrival) int { return a.At.Compare(b.At) })
	if len(got) != 3 {
		t.Fatalf("the webhook got %d requests, want 3", len(got))
	}
	for _, a := range got {
		if a.At.Before(at) {
			t.Errorf("%s arrived at %s, before its moment %s", a.Recipient, a.At.Format(time.StampMilli), at.Format(time.StampMilli))
		}
	}
	if first := got[0].At; first.After(at.Add(2 * time.Second)) {
		t.Errorf("the first arrived at %s, over 2s after the moment %s", first.Format(time.StampMilli), at.Format(time.StampMilli))
	}
	// The provider's slots (2/s, burst 1) and the recipients' windows were
	// taken from the moment on, half a second apart.
	var slots []time.Time
	for _, s := range f.ledger() {
		slots = append(slots, s)
	}
	slices.SortFunc(slots, time.Time.Compare)
	if len(slots) != 3 || slots[0].Before(at) || slots[1].Sub(slots[0]) < 500*time.Millisecond || slots[2].Sub(slots[1]) < 500*time.Millisecond {
		t.Errorf("provider slots %v, want 3 from %s on, 0.5s apart", slots, at.Format(time.StampMilli))
	}
	for id, m := range f.quotaMoments() {
		if m.Before(at) {
			t.Errorf("%s's window counted it at %s, before its moment", id, m.Format(time.StampMilli))
		}
	}
	if a := f.archived(); len(a) != 0 {
		for id, ti := range a {
			t.Errorf("%s archived: %s", id, ti.LastErr)
		}
	}
}
