//go:build integration

package integration_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// stopReason is the start of the LastErr of a job that was sleeping for a
// reserved provider token when its worker began to shut down (jobs.Throttle.admit).
const stopReason = "worker stopped before the provider token was due"

// TestGracefulShutdownReleasesReservations: a worker holds one send in
// flight (the webhook holds its answer) and five jobs sleeping inline for
// provider tokens reserved 1 to 5 s ahead (1 token/s, burst 1). On SIGTERM:
//   - the in-flight send finishes (the webhook answers 300 ms after the
//     signal) and its task completes, not redelivered;
//   - the sleeping jobs give their reservation and quota entry back at once
//     (the ledger, the recipients' sorted sets, and a probe reservation that
//     gets the next token within 1/rate instead of after the five reserved
//     ones) and are deferred, not lost: in the retry set with the reason;
//   - the worker exits with status 0;
//   - a second worker started afterwards delivers each of them once.
func TestGracefulShutdownReleasesReservations(t *testing.T) {
	const (
		rate     = 1.0
		sleepers = 5
	)
	cfg := fleetConfig{
		Concurrency:     10,
		ShutdownTimeout: 5 * time.Second,
		InlineWait:      15 * time.Second, // every job waits inline: 1-5 s
		Jitter:          200 * time.Millisecond,
		Policy:          "[{limit: 5, per: 1m}]",
		Rate:            rate,
		Burst:           1,
	}
	releaseSlow := make(chan struct{})
	f := newFleet(t, cfg, func(a arrival, seq int) hookAnswer {
		if a.Template == "slow" {
			return hookAnswer{Hold: releaseSlow}
		}
		return hookAnswer{}
	})
	ctx := context.Background()
	a := f.startWorker("a")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()

	// The slow send takes the bucket's one token and stays in flight.
	slow := f.enqueue(client, "shutdown-slow", message.Notification{Recipient: "slow@example.com", Template: "slow"})
	waitFor(t, "the slow send to reach the webhook", func() bool { return len(f.hook.snapshot()) > 0 })
	type sleeper struct{ id, recipient string }
	var js []sleeper
	for i := range sleepers {
		r := fmt.Sprintf("j%d@example.com", i)
		js = append(js, sleeper{f.enqueue(client, fmt.Sprintf("shutdown-j%d", i), message.Notification{Recipient: r, Template: "news"}), r})
	}
	// Every sleeper reserved a token: the ledger holds the slow one's and theirs.
	waitFor(t, "every job to reserve a token", func() bool { return len(f.ledger()) == 1+sleepers })
	reserved := f.ledger()
	last := time.Time{}
	for _, g := range reserved {
		if g.After(last) {
			last = g
		}
	}

	sigterm := time.Now()
	a.terminate()
	waitFor(t, "worker a to take the signal", func() bool { return strings.Contains(a.out.String(), "shutting down") })
	close(releaseSlow) // the in-flight send finishes after the signal
	f.stop(a)
	t.Logf("worker a exited %s after SIGTERM (shutdown_timeout %s); last reserved moment was %s after it",
		a.exited.Sub(sigterm), cfg.ShutdownTimeout, last.Sub(sigterm))
	if !strings.Contains(a.out.String(), "shutting down") {
		t.Errorf("worker a did not log its shutdown:\n%s", tail(a.out.String(), 20))
	}

	// The in-flight send finished after the signal and its task completed:
	// not redelivered.
	for _, a := range f.hook.snapshot() {
		if a.Key == slow && (a.Status != 200 || !a.Answered.After(sigterm)) {
			t.Errorf("slow send answered %d at %s, SIGTERM at %s: want 200 after the signal", a.Status,
				a.Answered.Format(time.StampMilli), sigterm.Format(time.StampMilli))
		}
	}
	if got := f.hook.delivered()[slow]; got != 1 {
		t.Errorf("slow task delivered %d times, want 1", got)
	}
	if ti, err := f.insp.GetTaskInfo(fleetQueue, slow); err != nil || ti.State != asynq.TaskStateCompleted {
		t.Errorf("slow task after shutdown: %v, %v; want completed", ti, err)
	}

	// The sleepers: deferred with the reason, holding nothing.
	arrivedAt := map[string]time.Time{}
	for _, a := range f.hook.snapshot() {
		arrivedAt[a.Key] = a.At
	}
	ledger := f.ledger()
	deferred := 0
	for _, j := range js {
		if at, ok := arrivedAt[j.id]; ok {
			if at.After(sigterm) {
				t.Errorf("job %s was sent %s after SIGTERM: it should have given its reservation back and been deferred", j.id, at.Sub(sigterm))
			} else {
				t.Logf("job %s was due before SIGTERM and was sent", j.id)
			}
			continue
		}
		deferred++
		ti, err := f.insp.GetTaskInfo(fleetQueue, j.id)
		if err != nil {
			t.Errorf("job %s lost after shutdown: %v", j.id, err)
			continue
		}
		if ti.State != asynq.TaskStateRetry || !strings.HasPrefix(ti.LastErr, stopReason) {
			t.Errorf("job %s after shutdown: state %v, last error %q; want retry with %q", j.id, ti.State, ti.LastErr, stopReason)
		}
		if _, held := ledger[j.id]; held {
			t.Errorf("job %s still holds its provider token after shutdown", j.id)
		}
		if err := f.rdb.ZScore(ctx, quotaKey(j.recipient), j.id).Err(); err != redis.Nil {
			t.Errorf("job %s still holds its quota entry for %s after shutdown (%v)", j.id, j.recipient, err)
		}
	}
	if deferred == 0 {
		t.Fatalf("every sleeping job was sent before SIGTERM: the test shows nothing")
	}

	// Another worker can use capacity given back: a probe reserving the
	// bucket now gets a token no later than the last reserved moment,
	// where the five reservations, none given back, would have put it a
	// whole token (1/rate) after the last of them. How much comes back depends on the order the
	// sleeping jobs release in: a reservation is refunded only while no
	// later one is held (a refunded middle one would hand out a moment a
	// later one still holds), so releases latest-first give back all five
	// and other orders less; the last release is always the latest left,
	// so at least one token always comes back.
	lim, err := throttle.New(f.rdb, throttle.Options{Prefix: fleetPrefix})
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := throttle.NewBucket(fleetProvider, rate, cfg.Burst)
	if err != nil {
		t.Fatal(err)
	}
	probe := throttle.Request{ID: "probe", Takes: []throttle.Take{{Rule: bucket, Subject: fleetProvider}}}
	d, err := lim.Admit(ctx, withWait(probe, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	perToken := time.Duration(float64(time.Second) / rate)
	if limit := time.Until(last) + perToken/2; !d.Allowed() || d.Delay > limit {
		t.Errorf("probe after shutdown: allowed %v, next token in %s; want at most %s (by the last reserved moment, %s after SIGTERM, not a token after it)",
			d.Allowed(), d.Delay, limit, last.Sub(sigterm))
	}
	t.Logf("probe after shutdown: next token in %s", d.Delay)
	if _, err := lim.Release(ctx, probe); err != nil {
		t.Fatal(err)
	}

	// Deferred, not lost: a second worker delivers each once.
	b := f.startWorker("b")
	f.waitSettled(60*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 1+sleepers })
	f.stop(b)
	got := f.hook.delivered()
	for _, j := range js {
		if got[j.id] != 1 {
			t.Errorf("job %s delivered %d times, want 1", j.id, got[j.id])
		}
	}
	if got[slow] != 1 {
		t.Errorf("slow job delivered %d times, want 1", got[slow])
	}
	var arrived, granted []time.Time
	for _, a := range f.hook.snapshot() {
		arrived = append(arrived, a.At)
	}
	for _, g := range f.ledger() {
		granted = append(granted, g)
	}
	checkBucket(t, "granted moments", granted, rate, cfg.Burst, grantResolution, nil)
	checkBucket(t, "arrivals", arrived, rate, cfg.Burst, skewTolerance, nil)
}

// waitFor polls cond every 20 ms for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShutdownReleaseKeepsProviderBucket: a worker sleeps on reservations
// of a bucket (1/s, burst 1) for its slots 1-5 s ahead while another client
// of the bucket (this test, standing in for a second worker) holds the
// slots after them, 6-9 s ahead. The worker stops and gives its five
// reservations back; the other client then reserves four more. Every moment
// the bucket granted, the released ones excepted, must still be within the
// bucket (at most burst + rate·T in any interval T): the freed capacity may
// be reused, but never on top of a slot that is still held.
func TestShutdownReleaseKeepsProviderBucket(t *testing.T) {
	const (
		rate     = 1.0
		burst    = 1
		sleepers = 5 // the worker's reservations, 1-5 s ahead
		held     = 4 // the other client's, 6-9 s ahead
		more     = 4 // reserved by the other client after the release
	)
	cfg := fleetConfig{
		Concurrency:     10,
		ShutdownTimeout: 5 * time.Second,
		InlineWait:      15 * time.Second,
		Jitter:          200 * time.Millisecond,
		Policy:          "[{limit: 5, per: 1m}]",
		Rate:            rate,
		Burst:           burst,
	}
	f := newFleet(t, cfg, nil)
	ctx := context.Background()
	a := f.startWorker("a")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	for i := range 1 + sleepers { // the first takes the burst token and is sent
		f.enqueue(client, fmt.Sprintf("refund-%d", i), message.Notification{Recipient: fmt.Sprintf("u%d@example.com", i), Template: "news"})
	}
	waitFor(t, "the worker to reserve its tokens", func() bool { return len(f.ledger()) == 1+sleepers })

	lim, err := throttle.New(f.rdb, throttle.Options{Prefix: fleetPrefix})
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := throttle.NewBucket(fleetProvider, rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	other := func(i int) throttle.Decision {
		t.Helper()
		r := throttle.Request{ID: fmt.Sprintf("other-%d", i), Takes: []throttle.Take{{Rule: bucket, Subject: fleetProvider}}}
		d, err := lim.Admit(ctx, withWait(r, time.Minute))
		if err != nil || !d.Allowed() {
			t.Fatalf("reserve %s: %+v, %v", r.ID, d, err)
		}
		return d
	}
	for i := range held {
		other(i)
	}
	f.stop(a)
	before := f.ledger()
	if len(before) != 1+held {
		t.Fatalf("after the worker stopped the ledger holds %d tokens, want %d (its sent one and the other client's)", len(before), 1+held)
	}
	for i := range more {
		other(held + i)
	}
	var granted []time.Time
	for _, g := range f.ledger() {
		granted = append(granted, g)
	}
	slices.SortFunc(granted, func(a, b time.Time) int { return a.Compare(b) })
	for i, g := range granted {
		t.Logf("granted %d: %s", i, g.Format("15:04:05.000000"))
	}
	checkBucket(t, "granted moments", granted, rate, burst, grantResolution, nil)
}

// withWait returns r with MaxWait w: a bucket short of tokens for at most w
// reserves ahead.
func withWait(r throttle.Request, w time.Duration) throttle.Request {
	r.MaxWait = w
	return r
}
