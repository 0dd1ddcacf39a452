package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// waiting puts tasks ids of queue q in its retry set as a handler's
// deferral leaves them (item 6 of the contract in internal/asynqdb):
// state "retry", scored an hour ahead (the whole second asynq would give
// a task whose moment is far off; the moment is Wake's to write).
func waiting(t *testing.T, rdb redis.UniversalClient, q string, ids ...string) {
	t.Helper()
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	for _, id := range ids {
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(id), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
		rdb.LRem(ctx, asynqdb.PendingKey(q), 0, id)
		rdb.HSet(ctx, asynqdb.TaskKey(q, id), "state", "retry")
		rdb.HDel(ctx, asynqdb.TaskKey(q, id), "pending_since")
		rdb.ZAdd(ctx, asynqdb.RetryKey(q), redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
	}
}

// movedAt polls queue q's pending list until each of ids is in it, and
// returns when each got there (this process's clock, which is Redis's host
// clock here).
func movedAt(t *testing.T, rdb redis.UniversalClient, q string, within time.Duration, ids ...string) map[string]time.Time {
	t.Helper()
	at := map[string]time.Time{}
	deadline := time.Now().Add(within)
	for len(at) < len(ids) {
		pending := rdb.LRange(context.Background(), asynqdb.PendingKey(q), 0, -1).Val()
		now := time.Now()
		for _, id := range ids {
			if _, ok := at[id]; !ok && slices.Contains(pending, id) {
				at[id] = now
			}
		}
		if now.After(deadline) {
			t.Fatalf("after %s, woken %v of %v", within, at, ids)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return at
}

// running runs m's loop until the test ends (or stop is called).
func running(t *testing.T, m *Member) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.loop(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// A task deferred to a moment runs again at that moment (on Redis's
// clock), not at the second asynq holds for it (an hour here), and before
// the tasks that were pending when it woke: it was booked ahead of them.
func TestWakeAtTheMomentAtTheHead(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "wake"
	m := New(rdb, []string{q}, Options{ID: "w", Log: quiet})
	running(t, m)
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()

	var mu sync.Mutex
	var order []string
	var wokeAt, wakeAt time.Time
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 10 * time.Millisecond,
		IsFailure:         func(error) bool { return false },
		RetryDelayFunc:    func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	err := srv.Start(m.Middleware(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		order = append(order, id)
		runs := len(slices.DeleteFunc(slices.Clone(order), func(s string) bool { return s != id }))
		mu.Unlock()
		switch {
		case id == "a" && runs == 1:
			// Deferred for a moment 0.8 s from now, with the pending
			// tasks behind it held until it is due.
			mu.Lock()
			wakeAt = time.Now().Add(800 * time.Millisecond)
			mu.Unlock()
			m.Wake(q, id, 800*time.Millisecond)
			return errors.New("booked")
		case id == "a":
			mu.Lock()
			wokeAt = time.Now()
			mu.Unlock()
		case id == "block":
			<-release
		}
		return nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID("a"), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a deferred to the retry set", 10*time.Second, func() bool {
		return rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Err() == nil
	})
	// Its moment written as its score, to the millisecond.
	waitUntil(t, "a's moment written", 5*time.Second, func() bool {
		s, err := rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Result()
		return err == nil && s != math.Trunc(s) || err == redis.Nil
	})
	// The worker busy with block, b and c pending behind it.
	for _, id := range []string{"block", "b", "c"} {
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(id), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "a moved to pending", 10*time.Second, func() bool {
		return rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Err() == redis.Nil
	})
	close(release)
	waitUntil(t, "every task run", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 5
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a", "block", "a", "b", "c"}; !slices.Equal(order, want) {
		t.Errorf("ran %v, want %v: a woken at the head of the queue", order, want)
	}
	// A look moves what is due within 2 wakeTogether; Redis's clock is this
	// machine's, read to the ms.
	if early := wakeAt.Sub(wokeAt); early > 2*wakeTogether+5*time.Millisecond {
		t.Errorf("a ran %v before its wake-up", early)
	}
}

// Tasks deferred to close moments wake in the order of their moments, each
// on time, whatever order they were deferred in.
func TestWakeKeepsTheOrderOfMoments(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	const q = "order"
	m := New(rdb, []string{q}, Options{ID: "w", Log: quiet})
	ids := []string{"t3", "t1", "t4", "t2"}
	waiting(t, rdb, q, ids...)
	start := time.Now()
	for _, id := range ids {
		d := 600*time.Millisecond + time.Duration(id[1]-'0')*80*time.Millisecond
		m.Wake(q, id, d)
	}
	running(t, m)
	at := movedAt(t, rdb, q, 5*time.Second, ids...)
	got := slices.Clone(ids)
	slices.SortFunc(got, func(a, b string) int { return at[a].Compare(at[b]) })
	if want := []string{"t1", "t2", "t3", "t4"}; !slices.Equal(got, want) {
		t.Errorf("woken in the order %v, want %v", got, want)
	}
	for _, id := range ids {
		want := start.Add(600*time.Millisecond + time.Duration(id[1]-'0')*80*time.Millisecond)
		if late := at[id].Sub(want); late < -2*wakeTogether-5*time.Millisecond || late > 150*time.Millisecond {
			t.Errorf("%s woken %v from its wake-up", id, late)
		}
	}
}

// A worker that deferred tasks and died before their moments leaves them
// to the others: their moments are in the retry set (written a few ms
// after each deferral), and the live workers that follow the queue look
// when the next one is due. They are woken on time, not at the next sweep
// a second later, nor at asynq's whole second after.
func TestWakeByTheFollowersOfADeadWorker(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "orphans"
	opts := func(id string) Options {
		return Options{ID: id, DeadAfter: 5 * time.Second, Log: quiet}
	}
	a, b := New(rdb, []string{q}, opts("a")), New(rdb, []string{q}, opts("b"))
	stopA := running(t, a)
	running(t, b)
	var ids []string
	for i := range 6 {
		ids = append(ids, fmt.Sprint("t", i))
	}
	waiting(t, rdb, q, ids...)
	start := time.Now()
	// The moments are 3 s ahead: the writes they wait for (20 ms after, on
	// a quiet machine) took over 2 s once in CI, under -race beside the
	// integration tests, and a must die before its moments come.
	for i, id := range ids {
		a.Wake(q, id, 3*time.Second+time.Duration(i)*150*time.Millisecond)
	}
	// Written, a score is a moment seconds ahead, no longer waiting()'s
	// hour (a moment may fall on a whole second: no test of the fraction).
	written := float64(time.Now().Add(time.Minute).Unix())
	waitUntil(t, "the moments written", 2500*time.Millisecond, func() bool {
		for _, id := range ids {
			if s, err := rdb.ZScore(ctx, asynqdb.RetryKey(q), id).Result(); err != nil || s > written {
				return false
			}
		}
		return true
	})
	stopA() // killed: its timers go with it; its beats stay, as a kill leaves them
	// Without followers nothing wakes them here (no asynq forwarder runs):
	// movedAt gives up. The bound tells a follower's look at the moment from
	// a sweep (every tick, 1 s apart), which would leave some of the six,
	// 150 ms apart, over 300 ms late; a busy machine made a follower's look
	// 90-113 ms late under -race.
	at := movedAt(t, rdb, q, 5*time.Second, ids...)
	for i, id := range ids {
		want := start.Add(3*time.Second + time.Duration(i)*150*time.Millisecond)
		if late := at[id].Sub(want); late > 300*time.Millisecond {
			t.Errorf("%s woken %v after its wake-up: the followers did not follow", id, late)
		}
	}
}

// A queue with work pending that no worker has picked up says so, and one
// emptied says so at the next look.
func TestWaitingSeesThePendingWork(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	const q = "backlog"
	m := New(rdb, []string{q}, Options{ID: "w", DeadAfter: time.Second, Log: quiet})
	running(t, m)
	if m.Waiting() {
		t.Fatal("an empty queue: waiting")
	}
	client := asynq.NewClientFromRedisClient(rdb)
	if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID("p"), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the pending task seen", 3*time.Second, m.Waiting)
	rdb.Del(context.Background(), asynqdb.PendingKey(q))
	waitUntil(t, "the emptied queue seen", 3*time.Second, func() bool { return !m.Waiting() })
}

// Only the two live workers a queue ranks first follow it, whoever asks,
// and every worker does when none is known alive.
func TestFollowers(t *testing.T) {
	live := []string{"w1", "w2", "w3", "w4", "w5"}
	for _, q := range []string{"default", "critical", "low", "default~1"} {
		n := 0
		for _, w := range live {
			if follows(q, w, live) {
				n++
			}
		}
		if n != followers {
			t.Errorf("%s: %d followers of %d live, want %d", q, n, len(live), followers)
		}
	}
	if !follows("default", "w1", nil) {
		t.Error("with no one known alive, a worker does not follow")
	}
}

// A retry score moves around now by k, to the ms; one due by now stays.
func TestScaled(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	for _, tc := range []struct {
		name  string
		score float64
		k     float64
		want  float64
		moved bool
	}{
		{"raised 2x", 1010, 0.5, 1005, true},
		{"lowered 2x", 1010.5, 2, 1021, true},
		{"due by now", 999.9, 0.5, 999.9, false},
		{"a fraction ahead", 1000.25, 4, 1001, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, moved := scaled(tc.score, now, tc.k)
			if math.Abs(got-tc.want) > 1e-9 || moved != tc.moved {
				t.Errorf("scaled(%v, k %v) = %v, %v; want %v, %v", tc.score, tc.k, got, moved, tc.want, tc.moved)
			}
		})
	}
}
