package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// worker is an asynq server with a Member in front of its handler, in
// this process: die stops its signs of life as a kill would (its asynq
// server and handlers run on, which a killed process's would not).
type worker struct {
	rec     *Member
	srv     *asynq.Server
	stop    context.CancelFunc
	stopped chan struct{}

	mu      sync.Mutex
	started map[string]int // task ID -> times a handler started it
	retries map[string]int // task ID -> asynq's retry count at the start
}

// startWorker runs a worker on queue "default"; handle is its handler's
// body after the start is recorded.
func startWorker(t *testing.T, rdb redis.UniversalClient, id string, deadAfter time.Duration, handle func(ctx context.Context, w *worker) error) *worker {
	t.Helper()
	w := &worker{started: map[string]int{}, retries: map[string]int{}, stopped: make(chan struct{})}
	w.rec = New(rdb, []string{"default"}, Options{ID: id, DeadAfter: deadAfter, Log: quiet, Metrics: NewMetrics(prometheus.NewRegistry())})
	w.srv = asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 4, Queues: map[string]int{"default": 1},
		LogLevel: asynq.FatalLevel, ShutdownTimeout: 2 * time.Second, TaskCheckInterval: 100 * time.Millisecond})
	h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, _ := asynq.GetRetryCount(ctx)
		w.mu.Lock()
		w.started[id]++
		w.retries[id] = n
		w.mu.Unlock()
		return handle(ctx, w)
	})
	if err := w.srv.Start(w.rec.Middleware(h)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.stop = cancel
	go func() { defer close(w.stopped); w.rec.loop(ctx) }()
	t.Cleanup(func() { w.die(); w.srv.Shutdown() })
	return w
}

// die stops the worker's signs of life and reaping, without leaving.
func (w *worker) die() { w.stop(); <-w.stopped }

// revive starts its signs of life and reaping again, as a worker does that
// comes back from a pause.
func (w *worker) revive() {
	ctx, cancel := context.WithCancel(context.Background())
	w.stop, w.stopped = cancel, make(chan struct{})
	stopped := w.stopped
	go func() { defer close(stopped); w.rec.loop(ctx) }()
}

func (w *worker) starts() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := map[string]int{}
	for k, v := range w.started {
		m[k] = v
	}
	return m
}

func enqueue(t *testing.T, rdb redis.UniversalClient, n int) []string {
	t.Helper()
	client := asynq.NewClientFromRedisClient(rdb)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("task-%02d", i)
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(id), asynq.MaxRetry(5)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeadWorkersTasksRunAgainAtOnce: worker A holds four tasks when it
// dies; worker B runs each of them once, with its retry count unchanged
// (no backoff, no failure counted), well before asynq's own recovery
// could. A, back, learns from Holds that the tasks were handed over, and
// what its asynq server then does with them changes nothing.
func TestDeadWorkersTasksRunAgainAtOnce(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	const deadAfter = time.Second
	release := make(chan struct{})
	holds := make(chan error, 4)
	a := startWorker(t, rdb, "A", deadAfter, func(ctx context.Context, w *worker) error {
		<-release
		err := w.rec.Holds(ctx)
		holds <- err
		return err // as jobs does: an error, so asynq retries rather than deletes
	})
	ids := enqueue(t, rdb, 4)
	waitUntil(t, "A to run all four", 10*time.Second, func() bool { return len(a.starts()) == 4 })
	b := startWorker(t, rdb, "B", deadAfter, func(ctx context.Context, w *worker) error { return nil })
	a.die()
	died := time.Now()
	waitUntil(t, "B to run A's four", 20*time.Second, func() bool { return len(b.starts()) == 4 })
	t.Logf("B ran A's tasks %s after A's last sign of life", time.Since(died).Round(10*time.Millisecond))
	for _, id := range ids {
		if b.started[id] != 1 || b.retries[id] != 0 {
			t.Errorf("%s: B ran it %d times with retry count %d, want once with 0", id, b.started[id], b.retries[id])
		}
	}
	if n := counter(t, b.rec.o.Metrics.Recovered.WithLabelValues("default")); n != 4 {
		t.Errorf("B's recovered_tasks_total %g, want 4", n)
	}
	close(release)
	for range 4 {
		if err := <-holds; !errors.Is(err, ErrHandedOver) {
			t.Errorf("A's Holds after the hand-over: %v, want ErrHandedOver", err)
		}
	}
	// A's asynq finds the tasks gone (B completed them): nothing is left.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	waitUntil(t, "the queue to empty", 10*time.Second, func() bool {
		qi, err := insp.GetQueueInfo("default")
		return err == nil && qi.Size == 0
	})
}

// TestLiveWorkerKeepsItsTasks: a worker whose tasks run for several times
// DeadAfter, showing signs of life, keeps them while another reaps.
func TestLiveWorkerKeepsItsTasks(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	const deadAfter = 2 * time.Second
	release := make(chan struct{})
	holds := make(chan error, 4)
	a := startWorker(t, rdb, "A", deadAfter, func(ctx context.Context, w *worker) error {
		<-release
		holds <- w.rec.Holds(ctx)
		return nil
	})
	enqueue(t, rdb, 4)
	waitUntil(t, "A to run all four", 10*time.Second, func() bool { return len(a.starts()) == 4 })
	b := startWorker(t, rdb, "B", deadAfter, func(ctx context.Context, w *worker) error { return nil })
	time.Sleep(3 * deadAfter) // the passage of time is what is under test
	close(release)
	for range 4 {
		if err := <-holds; err != nil {
			t.Errorf("A's Holds: %v, want nil", err)
		}
	}
	if got := b.starts(); len(got) != 0 {
		t.Errorf("B ran %v, A's tasks", got)
	}
	if n := counter(t, b.rec.o.Metrics.Recovered.WithLabelValues("default")); n != 0 {
		t.Errorf("B's recovered_tasks_total %g, want 0", n)
	}
}

// TestComebackWhileTheTaskRunsElsewhere: A comes back while B still runs
// the task it was handed, and A's handler returns an error (as jobs does
// on ErrHandedOver). asynq's Retry on A then moves the task from B's
// active list to the retry set (item 5 of the contract in internal/asynqdb)
// rather than deleting it, so whatever B's run does, the task is not lost:
// it runs once more, where the sent marker stops a second send.
func TestComebackWhileTheTaskRunsElsewhere(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	const deadAfter = time.Second
	releaseA, releaseB := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	a := startWorker(t, rdb, "A", deadAfter, func(ctx context.Context, w *worker) error {
		<-releaseA
		err := w.rec.Holds(ctx)
		aDone <- err
		return err
	})
	ids := enqueue(t, rdb, 1)
	waitUntil(t, "A to run the task", 10*time.Second, func() bool { return len(a.starts()) == 1 })
	b := startWorker(t, rdb, "B", deadAfter, func(ctx context.Context, w *worker) error {
		if w.starts()[ids[0]] == 1 {
			<-releaseB
		}
		return nil
	})
	a.die()
	waitUntil(t, "B to run it", 20*time.Second, func() bool { return len(b.starts()) == 1 })
	close(releaseA)
	if err := <-aDone; !errors.Is(err, ErrHandedOver) {
		t.Fatalf("A's Holds: %v, want ErrHandedOver", err)
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	waitUntil(t, "A's retry to move the task", 10*time.Second, func() bool {
		ti, err := insp.GetTaskInfo("default", ids[0])
		return err == nil && ti.State == asynq.TaskStateRetry
	})
	a.srv.Shutdown() // A is done with it; the re-run is B's
	close(releaseB)  // B's Done finds the task gone from active: NOT FOUND
	if err := insp.RunTask("default", ids[0]); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the task to run again on B and end", 20*time.Second, func() bool {
		qi, err := insp.GetQueueInfo("default")
		return err == nil && qi.Size == 0 && b.starts()[ids[0]] == 2
	})
}

// TestBackFromSilence: A comes back after B was handed its tasks, and
// shows signs of life again before its handlers ask whether they may send:
// a fresh sign after the silence does not make A the holder again.
func TestBackFromSilence(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	const deadAfter = time.Second
	release := make(chan struct{})
	holds := make(chan error, 2)
	a := startWorker(t, rdb, "A", deadAfter, func(ctx context.Context, w *worker) error {
		<-release
		err := w.rec.Holds(ctx)
		holds <- err
		return err
	})
	enqueue(t, rdb, 2)
	waitUntil(t, "A to run both", 10*time.Second, func() bool { return len(a.starts()) == 2 })
	b := startWorker(t, rdb, "B", deadAfter, func(ctx context.Context, w *worker) error { return nil })
	a.die()
	waitUntil(t, "B to run them", 20*time.Second, func() bool { return len(b.starts()) == 2 })
	a.revive()
	waitUntil(t, "A's next sign of life", 10*time.Second, func() bool {
		return rdb.ZScore(context.Background(), beatsKey(throttleDefaultPrefix, "default"), "A").Err() == nil
	})
	close(release)
	for range 2 {
		if err := <-holds; !errors.Is(err, ErrHandedOver) {
			t.Errorf("A's Holds after coming back: %v, want ErrHandedOver", err)
		}
	}
}

// TestReaperBackFromSilenceWaits: a worker whose own signs of life stopped
// for a while (as when Redis restarts) does not reap until it has shown
// them again for DeadAfter, so that the others, as silent as it was, are
// not taken for dead before they could show theirs.
func TestReaperBackFromSilenceWaits(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const deadAfter = time.Second
	r := New(rdb, []string{"default"}, Options{DeadAfter: deadAfter, Log: quiet})
	if err := r.beat(ctx, "default", "beat"); err != nil {
		t.Fatal(err)
	}
	if !r.mayReap("default") {
		t.Fatal("a worker that just started and beat may not reap")
	}
	time.Sleep(deadAfter * 6 / 10) // a silence of more than DeadAfter/2: what is under test
	if err := r.beat(ctx, "default", "beat"); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	if r.mayReap("default") {
		t.Fatal("a worker just back from a silence may reap")
	}
	for !r.mayReap("default") {
		if err := r.beat(ctx, "default", "beat"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(deadAfter / 10)
	}
	if waited := time.Since(back); waited < deadAfter {
		t.Errorf("reaping again %s after the silence, want DeadAfter (%s)", waited, deadAfter)
	}
}
