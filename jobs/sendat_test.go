package jobs

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// TestDeadlineCountsFromSendAt: a policy's max delay counts from a
// scheduled notification's moment, not from when it was queued; a send-by
// before that still comes first.
func TestDeadlineCountsFromSendAt(t *testing.T) {
	queued := time.Date(2030, 1, 1, 8, 0, 0, 0, time.UTC)
	at := queued.Add(24 * time.Hour)
	by := at.Add(30 * time.Minute)
	for _, tc := range []struct {
		name string
		n    message.Notification
		want time.Time
	}{
		{"not scheduled", message.Notification{Queued: &queued}, queued.Add(time.Hour)},
		{"scheduled", message.Notification{Queued: &queued, SendAt: &at}, at.Add(time.Hour)},
		{"scheduled, a send-by sooner", message.Notification{Queued: &queued, SendAt: &at, SendBy: &by}, by},
		{"a moment before it was queued", message.Notification{Queued: &at, SendAt: &queued}, at.Add(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job{n: tc.n, policy: PolicySettings{MaxDelay: time.Hour}}
			if got, what := j.deadline(); !got.Equal(tc.want) {
				t.Errorf("deadline %s (%s), want %s", got, what, tc.want)
			}
		})
	}
}

// TestScheduledSendGoesAtItsMoment: a task scheduled seconds ahead waits in
// asynq's schedule, takes nothing of its recipient's quota before its
// moment, and is sent at it, not before; its policy's max delay counts
// from the moment, so one queued long before is not expired.
func TestScheduledSendGoesAtItsMoment(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, settings: PolicySettings{MaxDelay: time.Minute}})
	queued := time.Now().Add(-time.Hour).UTC().Truncate(time.Second) // a max delay past, counted from here
	at := message.WholeSecond(time.Now().Add(1500 * time.Millisecond))
	h.enqueue(t, "later", message.Notification{Recipient: "alice", SendAt: &at, Queued: &queued})
	info, err := h.insp.GetTaskInfo("default", "later")
	if err != nil || info.State != asynq.TaskStateScheduled || !info.NextProcessAt.Equal(at) {
		t.Fatalf("task %+v (%v): want scheduled for %s", info, err, at)
	}
	if n := quotaSize(t, h, "alice"); n != 0 && time.Now().Before(at) {
		t.Errorf("alice's quota holds %d entries before the moment, want none", n)
	}
	h.await(t, "later", "completed", state(asynq.TaskStateCompleted))
	sent, ok := h.sentAt("later")
	if !ok || sent.Before(at) || sent.After(at.Add(2*time.Second)) {
		t.Errorf("sent at %s (%v), want within 2s from its moment %s", sent.Format(time.StampMilli), ok, at.Format(time.StampMilli))
	}
}
