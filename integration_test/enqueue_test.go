//go:build integration

package integration_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
)

// TestEnqueueDuplicateAfterDelivery: a notification enqueued with an
// idempotency key (single mode: the task ID on stdout) is delivered by a
// worker; enqueueing it again afterwards must not deliver it again (README:
// "With `-key` the task ID is derived from the key, so enqueueing the same
// notification again is a duplicate, not a second message"). enqueue may report the duplicate itself (when the task is still
// known to asynq) or enqueue it again for the worker to complete without
// sending (sent markers); either way the webhook gets it once and the task
// ends completed.
func TestEnqueueDuplicateAfterDelivery(t *testing.T) {
	bin := buildBinary(t, "enqueue")
	f := newFleet(t, fleetConfig{
		Concurrency: 2, ShutdownTimeout: 2 * time.Second, InlineWait: time.Second,
		Policy: "[{limit: 5, per: 1m}]", Rate: 10, Burst: 1,
	}, nil)
	cfg := f.writeConfig("enqueue", "")
	w := f.startWorker("w1")
	id := message.TaskID("dup-1")
	args := []string{"-config", cfg, "-to", "dup@example.com", "-template", "news", "-key", "dup-1", "-send-by", "90m"}

	stdout, stderr, code := runCommand(t, f.dir, nil, bin, args...)
	if code != 0 || stdout != id+"\n" || stderr != "" {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q; want 0, the task ID %s and nothing", code, stdout, stderr, id)
	}
	f.waitSettled(20*time.Second, func(asynq.QueueInfo) bool { return f.hook.delivered()[id] == 1 })

	stdout, stderr, code = runCommand(t, f.dir, nil, bin, args...)
	duplicate := "enqueue: duplicate: task " + id + ` (idempotency key "dup-1") is already in queue default; not enqueued again` + "\n"
	if code != 0 || stdout != id+"\n" || stderr != "" && stderr != duplicate {
		t.Errorf("enqueue again after delivery: exit %d, stdout %q, stderr %q; want 0, %s and nothing or %q", code, stdout, stderr, id, duplicate)
	}
	t.Logf("enqueue again after delivery said %q", stderr)
	// A task it enqueued is in the queue when it returns, so waitSettled
	// waits for what the worker makes of it.
	f.waitSettled(20*time.Second, func(asynq.QueueInfo) bool { return true })
	f.stop(w)
	if got := f.hook.snapshot(); len(got) != 1 || got[0].Key != id {
		t.Errorf("the webhook got %d requests (%+v), want 1 for task %s", len(got), got, id)
	}
	if a := f.archived(); len(a) != 0 {
		t.Errorf("archived: %v, want nothing", a)
	}
}
