//go:build integration

package integration_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/jobs"
)

// TestOverCapThroughTheWorker runs the worker binary with a policy that
// drops and one that defers with a max delay: of three messages to one
// recipient on the first, one is sent and two are archived as dropped, with
// the reason and counted; of two to another on the second, one is sent and
// the other expires, saying it is the max delay.
func TestOverCapThroughTheWorker(t *testing.T) {
	cfg := fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: time.Second, Jitter: 0,
		Policy:       "{windows: [{limit: 1, per: 1h}], over_cap: drop}",
		MorePolicies: "\n  slow: {windows: [{limit: 1, per: 1h}], max_delay: 10m}",
		Rate:         100, Burst: 10, Book: true,
	}
	f := newFleet(t, cfg, func(arrival, int) hookAnswer { return hookAnswer{} })
	w := f.startWorker("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	first := f.enqueue(client, "drop-0", jobs.Notification{Recipient: "alice@example.com", Template: "promo"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 1 })
	dropped := []string{
		f.enqueue(client, "drop-1", jobs.Notification{Recipient: "alice@example.com", Template: "promo"}),
		f.enqueue(client, "drop-2", jobs.Notification{Recipient: "alice@example.com", Template: "promo"}),
	}
	sent := f.enqueue(client, "slow-0", jobs.Notification{Recipient: "bob@example.com", Policy: "slow", Template: "news"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 2 })
	late := f.enqueue(client, "slow-1", jobs.Notification{Recipient: "bob@example.com", Policy: "slow", Template: "news"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 2 && q.Archived == 3 })

	got := f.hook.delivered()
	if len(got) != 2 || got[first] != 1 || got[sent] != 1 {
		t.Errorf("webhook got %v, want %s and %s once each", got, first, sent)
	}
	archived := f.archived()
	for _, id := range dropped {
		if a := archived[id]; a == nil || a.LastErr != "dropped: over policy pace (1 per 1h): skip retry for the task" {
			t.Errorf("%s archived as %+v, want dropped over policy pace (1 per 1h)", id, a)
		}
	}
	re := regexp.MustCompile(`^expired: max_delay 10m of policy slow \(until \S+\) passed before policy slow \(1 per 1h\) would allow it`)
	if a := archived[late]; a == nil || !re.MatchString(a.LastErr) {
		t.Errorf("%s archived as %+v, want it expired by slow's max_delay", late, a)
	}
	m := f.metricsOf(w)
	if n := m[`throttler_dropped_total{policy="pace"}`]; n != 2 {
		t.Errorf("throttler_dropped_total{policy=\"pace\"} = %v, want 2", n)
	}
	if n := m[`throttler_expired_total{policy="slow"}`]; n != 1 {
		t.Errorf("throttler_expired_total{policy=\"slow\"} = %v, want 1", n)
	}
}

// TestCountOnlyThroughTheWorker runs the worker binary with a reset policy
// that counts toward pace: resets to a recipient whose pace cap is full are
// sent, and a pace message after a reset is held back by pace.
func TestCountOnlyThroughTheWorker(t *testing.T) {
	cfg := fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: time.Second, Jitter: 0,
		Policy:       "[{limit: 1, per: 1h}]",
		MorePolicies: "\n  reset: {windows: [{limit: 5, per: 1h}], counts_toward: [pace]}",
		Rate:         100, Burst: 10, Book: true,
	}
	f := newFleet(t, cfg, func(arrival, int) hookAnswer { return hookAnswer{} })
	f.startWorker("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	promo := f.enqueue(client, "alice-promo", jobs.Notification{Recipient: "alice@example.com", Template: "promo"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 1 })
	resets := []string{
		f.enqueue(client, "alice-reset-1", jobs.Notification{Recipient: "alice@example.com", Policy: "reset", Template: "reset"}),
		f.enqueue(client, "alice-reset-2", jobs.Notification{Recipient: "alice@example.com", Policy: "reset", Template: "reset"}),
		f.enqueue(client, "bob-reset", jobs.Notification{Recipient: "bob@example.com", Policy: "reset", Template: "reset"}),
	}
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 4 })
	held := f.enqueue(client, "bob-promo", jobs.Notification{Recipient: "bob@example.com", Template: "promo"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := f.insp.GetTaskInfo(fleetQueue, held)
		if err == nil && info.State == asynq.TaskStateScheduled || err == nil && info.State == asynq.TaskStateRetry {
			if !regexp.MustCompile(`policy pace \(1 per 1h\)`).MatchString(info.LastErr) {
				t.Errorf("bob's promo is waiting for %q, want policy pace (1 per 1h)", info.LastErr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's promo never deferred: %+v, %v", info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := f.hook.delivered()
	for _, id := range append(resets, promo) {
		if got[id] != 1 {
			t.Errorf("webhook got %s %d times, want once (all sent: %v)", id, got[id], got)
		}
	}
	if got[held] != 0 {
		t.Errorf("bob's promo was sent after a reset that counts toward pace")
	}
}
