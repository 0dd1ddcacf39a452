package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/throttle"
)

// TestWorkSlotsGivenBackWhileAsleep: a job that sleeps for its moment gives
// its work slot back, a job waiting for one shows as unseen work, and one
// still waiting when the worker stops gives up.
func TestWorkSlotsGivenBackWhileAsleep(t *testing.T) {
	t.Parallel()
	w := NewWorkSlots(1)
	stop := make(chan struct{})
	ctx1, s1, ok := w.take(context.Background(), stop)
	if !ok || s1 == nil {
		t.Fatal("the first take of a free slot failed")
	}
	took := make(chan bool)
	go func() {
		_, s2, ok := w.take(context.Background(), stop)
		s2.giveBack()
		took <- ok
	}()
	for deadline := time.Now().Add(5 * time.Second); !w.Waiting(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a job waiting for the only work slot does not show as waiting")
		}
	}
	sleeping(ctx1) // the first job sleeps for its moment
	if !<-took {
		t.Fatal("the waiting job did not get the slot the sleeping one gave back")
	}
	s1.giveBack() // its handler's deferred give-back: a no-op now
	if w.Waiting() {
		t.Error("Waiting after every job got its slot")
	}
	_, s3, ok := w.take(context.Background(), stop)
	if !ok {
		t.Fatal("the slot was given back twice or not at all")
	}
	go func() {
		_, _, ok := w.take(context.Background(), stop)
		took <- ok
	}()
	close(stop)
	if <-took {
		t.Error("a job waiting for a work slot when the worker stopped took one")
	}
	s3.giveBack()
}

// TestSleepersLeaveTheWorkSlotsFree: with one work slot and sleep slots
// beside it, jobs asleep in the worker for their provider's tokens do not
// hold back a job queued after them for another provider, which may go at
// once. With the one slot held while asleep it would wait for both
// sleepers (6 s).
func TestSleepersLeaveTheWorkSlotsFree(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 100, Per: time.Hour})
	slow, _ := throttle.NewBucket("gw", 1.0/3, 1) // a send every 3 s
	fast, _ := throttle.NewBucket("fast", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: slow, inlineWait: 10 * time.Second, workSlots: 1, sleepSlots: 3,
		moreBuckets: map[string]*throttle.Bucket{"fast": fast}})
	for _, id := range []string{"a", "b", "c"} {
		h.enqueue(t, id, Notification{Recipient: id + "@example.com"})
	}
	h.awaitSent(t, 1, 10*time.Second)
	// b and c now sleep in the worker for their tokens, 3 s and 6 s.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		infos, err := h.insp.ListActiveTasks("default")
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks active, want b and c asleep", len(infos))
		}
	}
	h.enqueue(t, "free", Notification{Recipient: "free@example.com", Policy: "mkt", Provider: "fast", Template: "welcome"})
	h.await(t, "free", "completed", state(asynq.TaskStateCompleted))
	free, _ := h.sentAt("free")
	if b, ok := h.sentAt("b"); ok && !b.After(free) {
		t.Errorf("free sent %s after b, which slept 3 s for its token: the sleepers held the work slot", free.Sub(b))
	}
	h.awaitAll(t, []string{"a", "b", "c"}, 20*time.Second)
	for _, id := range []string{"b", "c"} {
		if info, _ := h.insp.GetTaskInfo("default", id); info.Retried != 0 {
			t.Errorf("%s was deferred (%q), not slept for its token", id, info.LastErr)
		}
	}
}
