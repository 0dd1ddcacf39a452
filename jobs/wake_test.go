package jobs

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// A task deferred by its handler with a wake-up noted in the Waker runs
// again at that wake-up (on Redis's clock), not at the second asynq holds
// for it (an hour here), and before the tasks that were pending when it
// woke: it was booked ahead of them.
func TestWakerWakesAtTheMomentAtTheHead(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "wake"
	const lead = 300 * time.Millisecond
	w := NewWaker(rdb, "", []string{q}, lead)
	go w.Run(ctx)
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()

	var mu sync.Mutex
	var order []string
	var wokeAt time.Time
	var wakeAt time.Time
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 10 * time.Millisecond,
		IsFailure:         func(error) bool { return false },
		RetryDelayFunc:    func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		order = append(order, id)
		runs := len(slices.DeleteFunc(slices.Clone(order), func(s string) bool { return s != id }))
		mu.Unlock()
		switch {
		case id == "a" && runs == 1:
			// Deferred for a moment 0.8 s from now (Redis's clock), with
			// the pending tasks behind it held until it is due.
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			wakeAt = now.Add(800 * time.Millisecond).Add(-lead)
			mu.Unlock()
			if err := w.note(ctx, q, id, now.Add(800*time.Millisecond)); err != nil {
				return err
			}
			return errors.New("booked")
		case id == "a":
			mu.Lock()
			wokeAt = time.Now()
			mu.Unlock()
		case id == "block":
			<-release
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID("a"), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a deferred to the retry set", func() bool {
		return rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Err() == nil
	})
	// The worker busy with block, b and c pending behind it.
	for _, id := range []string{"block", "b", "c"} {
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(id), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "a moved to pending", func() bool {
		return rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Err() == redis.Nil
	})
	close(release)
	waitFor(t, 10*time.Second, "every task run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 5
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a", "block", "a", "b", "c"}; !slices.Equal(order, want) {
		t.Errorf("ran %v, want %v: a woken at the head of the queue", order, want)
	}
	// Redis runs on this machine: its clock is this one's, to the
	// millisecond the wake set keeps; a look moves what is due within
	// 2 wakeTogether.
	if early := wakeAt.Sub(wokeAt); early > 2*wakeTogether+2*time.Millisecond {
		t.Errorf("a ran %v before its wake-up", early)
	}
	if n := rdb.ZCard(ctx, w.notesKey(q)).Val(); n != 0 {
		t.Errorf("wake set holds %d after the wake-up, want 0", n)
	}
}

// A wake-up due while its task is still active (its handler deferred it,
// asynq's Retry has not run yet) waits for the task to reach the retry set;
// one whose task has gone (run already, deleted), or has been active for
// wakeActive since it was due (run by other means), is dropped.
func TestWakerWaitsForTheRetryAndDropsWhatIsGone(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "wake"
	w := NewWaker(rdb, "", []string{q}, 0)
	key := asynqdb.TaskKey(q, "a")
	for _, id := range []string{"a", "running"} {
		rdb.HSet(ctx, asynqdb.TaskKey(q, id), "state", asynqdb.StateActive, "msg", "x")
	}
	now := time.Now()
	for id, at := range map[string]time.Time{"a": now.Add(-100 * time.Millisecond), "gone": now, "running": now.Add(-wakeActive - time.Second)} {
		if err := w.note(ctx, q, id, at); err != nil {
			t.Fatal(err)
		}
	}
	w.look(ctx, []string{q}, false)
	if got := rdb.ZRange(ctx, w.notesKey(q), 0, -1).Val(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("wake set %v after a look, want [a]: the task just deferred kept, the others dropped", got)
	}
	if n := rdb.LLen(ctx, asynqdb.PendingKey(q)).Val(); n != 0 {
		t.Fatalf("pending holds %d, want 0: an active task is not moved", n)
	}
	// asynq's Retry: the task waits in the retry set.
	waitsInRetry(t, rdb, q, "a")
	w.look(ctx, []string{q}, false)
	if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("pending %v, want [a]", got)
	}
	if h := rdb.HGetAll(ctx, key).Val(); h["state"] != asynqdb.StatePending || len(h["pending_since"]) < 19 {
		t.Errorf("task hash %v, want state pending and pending_since in Unix ns", h)
	}
	if n := rdb.ZCard(ctx, asynqdb.RetryKey(q)).Val() + rdb.ZCard(ctx, w.notesKey(q)).Val(); n != 0 {
		t.Errorf("retry and wake sets hold %d, want 0", n)
	}
}

// Tasks due together are dequeued in the order of their wake-ups.
func TestWakerKeepsTheOrderOfWakeUps(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "wake"
	w := NewWaker(rdb, "", []string{q}, 0)
	rdb.LPush(ctx, asynqdb.PendingKey(q), "queued")
	base := time.Now().Add(-time.Second)
	for i, id := range []string{"first", "second", "third"} {
		waitsInRetry(t, rdb, q, id)
		if err := w.note(ctx, q, id, base.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	w.look(ctx, []string{q}, false)
	// The dequeue pops the right end (the head).
	got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val()
	slices.Reverse(got)
	if want := []string{"first", "second", "third", "queued"}; !slices.Equal(got, want) {
		t.Errorf("dequeue order %v, want %v", got, want)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A wake-up noted by a worker that died is moved by another's Waker, which
// looks at every queue every WakeEvery.
func TestWakerMovesTheNotesOfAWorkerGone(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "wake"
	gone := NewWaker(rdb, "", []string{q}, 0)
	waitsInRetry(t, rdb, q, "a")
	if err := gone.note(ctx, q, "a", time.Now().Add(200*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	go NewWaker(rdb, "", []string{"other", q}, 0).Run(ctx)
	waitFor(t, 10*time.Second, "a moved to pending", func() bool {
		return slices.Equal(rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(), []string{"a"})
	})
}

// A wake-up due before asynq has moved its task to the retry set (its
// handler noted a moment closer than the lead) is kept until the task is
// there, and then moved.
func TestWakerWakesATaskDueAtOnce(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "wake"
	w := NewWaker(rdb, "", []string{q}, 300*time.Millisecond)
	go w.Run(ctx)
	runs := make(chan struct{}, 2)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 10 * time.Millisecond,
		IsFailure:         func(error) bool { return false },
		RetryDelayFunc:    func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	n := 0
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		n++
		runs <- struct{}{}
		if n == 1 {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			if err := w.note(ctx, q, "a", now.Add(100*time.Millisecond)); err != nil {
				return err
			}
			// The Waker looks before asynq's Retry runs.
			time.Sleep(50 * time.Millisecond)
			return errors.New("booked")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID("a"), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		select {
		case <-runs:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d of a did not come", i+1)
		}
	}
}

// Wake-ups a few ms apart are each moved when due by the worker that noted
// them, with no look at every queue to catch one left behind.
func TestWakerMovesEveryNoteOfItsOwn(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "wake"
	const n = 40
	w := NewWaker(rdb, "", []string{q}, 0)
	w.every = time.Hour
	go w.Run(ctx)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := strconv.Itoa(i)
		waitsInRetry(t, rdb, q, id)
		if err := w.note(ctx, q, id, now.Add(200*time.Millisecond+time.Duration(i)*3*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "every task moved to pending", func() bool {
		return rdb.LLen(ctx, asynqdb.PendingKey(q)).Val() == n
	})
}

// A wake-up scales as its job's moment does (Lead before it), and asynq's
// wake-up for it is the second after the Waker's.
func TestWakerScaled(t *testing.T) {
	w := NewWaker(nil, "", nil, 250*time.Millisecond)
	now := time.UnixMilli(1_000_000)
	for _, tc := range []struct {
		name        string
		wake        int64
		k           float64
		want, score int64
	}{
		{"raised 2x", 1_009_750, 0.5, 1_004_750, 1005}, // its moment 1_010_000 -> 1_005_000
		{"lowered 2x", 1_009_750, 2, 1_019_750, 1020},  // 1_010_000 -> 1_020_000
		{"due by now", 999_000, 2, 999_000, 1000},      // its moment 999_250 is past
	} {
		got, score := w.scaled(float64(tc.wake), now, tc.k)
		if got != tc.want || score != tc.score {
			t.Errorf("%s: scaled = %d, %d; want %d, %d", tc.name, got, score, tc.want, tc.score)
		}
	}
}

// waitsInRetry puts task id of queue q in its retry set as asynq's Retry
// does, due in an hour.
func waitsInRetry(t *testing.T, rdb redis.UniversalClient, q, id string) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.HSet(ctx, asynqdb.TaskKey(q, id), "state", "retry").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, asynqdb.RetryKey(q), redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
}

// A wake-up moved by a change of rate is moved to pending at its new time
// by the Waker that moved it (into its own set), with no sweep to find it:
// the worker that noted it looks at the old time.
func TestWakerWakesAtAMovedWakeUp(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "wake"
	w := NewWaker(rdb, "", []string{q}, 0)
	w.every = time.Hour
	go w.Run(ctx)
	noter := NewWaker(rdb, "", []string{q}, 0)
	waitsInRetry(t, rdb, q, "a")
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := noter.note(ctx, q, "a", now.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	score := rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Val()
	notes, err := w.notesOf(ctx, q)
	if err != nil || notes["a"].key != noter.notesKey(q) {
		t.Fatalf("notesOf = %v, %v; want a in %s", notes, err, noter.notesKey(q))
	}
	// The rate raised 40x: its moment 0.5 s from now.
	a := queued{q: q, id: "a", score: score, wake: notes["a"].wake, wakeKey: notes["a"].key}
	n, err := moveWakeups(ctx, rdb, w, []queued{a}, func(queued) float64 { return 1.0 / 40 }, now)
	if err != nil || n != 1 {
		t.Fatalf("moveWakeups = %d, %v; want 1", n, err)
	}
	if rdb.ZScore(ctx, w.notesKey(q), "a").Err() != nil || rdb.Exists(ctx, noter.notesKey(q)).Val() != 0 {
		t.Fatalf("the moved wake-up is not in the mover's set alone")
	}
	waitFor(t, 10*time.Second, "a moved to pending at its new wake-up", func() bool {
		return slices.Equal(rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(), []string{"a"})
	})
}

// The wake-ups of a worker that stopped sweeping (killed) are adopted by
// the next worker to sweep after orphanAfter, which then moves each when
// it is due, as its own: a sweep alone finds them up to WakeEvery late.
func TestWakerAdoptsTheNotesOfAWorkerKilled(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "wake"
	const n = 10
	killed := NewWaker(rdb, "", []string{q}, 0)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Due after the adoption (the sweeper's first sweep after orphanAfter
	// that follows one of its own), 90 ms apart.
	wakes := map[string]int64{}
	for i := range n {
		id := strconv.Itoa(i)
		waitsInRetry(t, rdb, q, id)
		at := now.Add(time.Duration(orphanAfter*float64(WakeEvery)) + 2*WakeEvery + time.Duration(i)*90*time.Millisecond)
		if err := killed.note(ctx, q, id, at); err != nil {
			t.Fatal(err)
		}
		wakes[id] = at.UnixMilli()
	}
	w := NewWaker(rdb, "", []string{q}, 0)
	go w.Run(ctx)
	waitFor(t, 20*time.Second, "every task moved to pending", func() bool {
		return rdb.LLen(ctx, asynqdb.PendingKey(q)).Val() == n
	})
	for id, wake := range wakes {
		since, err := rdb.HGet(ctx, asynqdb.TaskKey(q, id), "pending_since").Int64()
		if err != nil {
			t.Fatal(err)
		}
		if late := time.Duration(since - wake*int64(time.Millisecond)); late > 100*time.Millisecond || late < -3*wakeTogether {
			t.Errorf("task %s moved %v after its wake-up, want within -%v and 100ms", id, late, 3*wakeTogether)
		}
	}
	if rdb.Exists(ctx, killed.notesKey(q)).Val() != 0 || rdb.ZScore(ctx, ownersKey(killed.prefix, q), killed.id).Err() != redis.Nil {
		t.Errorf("the killed worker's set or listing is still there")
	}
}

// A Waker that stops leaves its wake-ups to the next worker to sweep, at
// once, and so does a wake-up noted after it stopped (a handler ending in
// the shutdown).
func TestWakerLeavesItsNotesToTheNextSweep(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "wake"
	leaving := NewWaker(rdb, "", []string{q}, 0)
	leaving.every = time.Hour
	run, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); leaving.Run(run) }()
	for _, id := range []string{"a", "b"} {
		waitsInRetry(t, rdb, q, id)
	}
	if err := leaving.note(ctx, q, "a", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the leaving worker listed", func() bool {
		return rdb.ZScore(ctx, ownersKey(leaving.prefix, q), leaving.id).Val() > 0
	})
	stop()
	<-done
	w := NewWaker(rdb, "", []string{q}, 0)
	w.look(ctx, []string{q}, true)
	if got := rdb.ZRange(ctx, w.notesKey(q), 0, -1).Val(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the next sweeper's set holds %v, want [a]", got)
	}
	if err := leaving.note(ctx, q, "b", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	w.look(ctx, []string{q}, true)
	if got := rdb.ZRange(ctx, w.notesKey(q), 0, -1).Val(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("the next sweeper's set holds %v, want [a b]", got)
	}
	if owners := rdb.ZRange(ctx, ownersKey(w.prefix, q), 0, -1).Val(); !slices.Equal(owners, []string{w.id}) {
		t.Errorf("owners %v, want only the sweeper", owners)
	}
}

// On a Redis Cluster, with queues in different slots: a sweep adopts a
// killed worker's set of each queue (the sets its script names itself are
// in the queue's slot), the adopter wakes the tasks when due, and a re-pace
// moves a wake-up from another worker's set into its own.
func TestWakerOnCluster(t *testing.T) {
	rdb := redistest.StartCluster(t, 3, 0).Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queues := []string{"critical", "default", "low"}
	killed, other := NewWaker(rdb, "", queues, 0), NewWaker(rdb, "", queues, 0)
	w := NewWaker(rdb, "", queues, 0)
	w.every = 200 * time.Millisecond
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		waitsInRetry(t, rdb, q, "a")
		if err := killed.note(ctx, q, "a", now.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		waitsInRetry(t, rdb, q, "b")
		if err := other.note(ctx, q, "b", now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	go w.Run(ctx)
	for _, q := range queues {
		waitFor(t, 10*time.Second, "a of "+q+" moved to pending", func() bool {
			return slices.Equal(rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(), []string{"a"})
		})
		if rdb.Exists(ctx, killed.notesKey(q)).Val() != 0 {
			t.Errorf("queue %s: the killed worker's set is still there", q)
		}
		notes, err := w.notesOf(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		b := queued{q: q, id: "b", score: rdb.ZScore(ctx, asynqdb.RetryKey(q), "b").Val(), wake: notes["b"].wake, wakeKey: notes["b"].key}
		if n, err := moveWakeups(ctx, rdb, w, []queued{b}, func(queued) float64 { return 0.5 }, now); err != nil || n != 1 {
			t.Fatalf("queue %s: moveWakeups = %d, %v; want 1", q, n, err)
		}
		if rdb.ZScore(ctx, w.notesKey(q), "b").Err() != nil {
			t.Errorf("queue %s: the moved wake-up is not in the mover's set", q)
		}
	}
}

// A worker that missed a sweep (stopped, or killed and not yet adopted) has
// the wake-ups due before the next sweep moved by the next worker to sweep,
// early, rather than late at the sweep after; one silent past orphanAfter
// has its set adopted by a worker that swept on time itself.
func TestWakerMovesASuspectsWakeUpsEarly(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "wake"
	stopped := NewWaker(rdb, "", []string{q}, 0)
	w := NewWaker(rdb, "", []string{q}, 0)
	w.every = time.Second
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for id, in := range map[string]time.Duration{"soon": 300 * time.Millisecond, "later": 5 * time.Second} {
		waitsInRetry(t, rdb, q, id)
		if err := stopped.note(ctx, q, id, now.Add(in)); err != nil {
			t.Fatal(err)
		}
	}
	silent := func(d time.Duration) {
		t.Helper()
		if err := rdb.ZAdd(ctx, ownersKey(w.prefix, q), redis.Z{Score: float64(now.Add(-d).UnixMilli()), Member: stopped.id}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	silent(1200 * time.Millisecond) // a sweep missed: suspect
	w.look(ctx, []string{q}, true)
	if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, []string{"soon"}) {
		t.Fatalf("pending %v after a sweep, want [soon]: the suspect's wake-up due within a sweep moved early", got)
	}
	if got := rdb.ZRange(ctx, stopped.notesKey(q), 0, -1).Val(); !slices.Equal(got, []string{"later"}) {
		t.Fatalf("the suspect's set holds %v, want [later]: not adopted", got)
	}
	silent(2 * time.Second) // past orphanAfter
	w.look(ctx, []string{q}, true)
	if got := rdb.ZRange(ctx, w.notesKey(q), 0, -1).Val(); !slices.Equal(got, []string{"later"}) {
		t.Errorf("the sweeper's set holds %v, want [later]: adopted", got)
	}
}
