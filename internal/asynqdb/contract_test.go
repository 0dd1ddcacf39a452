//go:build integration

package asynqdb_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestContract checks each item of the package's contract against the
// asynq this module builds with, on a real Redis: the asynq version, the
// keys and task hash its Client writes, the message encoding byte for
// byte, and the keys a dequeue moves a task through.
func TestContract(t *testing.T) {
	t.Run("version", func(t *testing.T) {
		// A test binary carries no module versions: ask the go command.
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}} {{.Replace}}", "github.com/hibiken/asynq").Output()
		if err != nil {
			t.Fatalf("go list -m github.com/hibiken/asynq: %v", err)
		}
		if got := strings.TrimSpace(string(out)); got != asynqdb.Version+" <nil>" {
			t.Fatalf("asynq is %s; the contract was checked on %s: read asynq's internal/rdb again, update the contract and asynqdb.Version",
				got, asynqdb.Version)
		}
	})

	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	const q = "contract"
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()

	t.Run("enqueue", func(t *testing.T) {
		payload := []byte(`{"k":"v"}`)
		for _, id := range []string{"first", "second"} {
			_, err := client.Enqueue(asynq.NewTask("notify", payload), asynq.TaskID(id), asynq.Queue(q),
				asynq.MaxRetry(7), asynq.Timeout(90*time.Second), asynq.Retention(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
		}
		// LPUSH: the head, dequeued first, is the right end.
		if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, []string{"second", "first"}) {
			t.Errorf("%s: %q, want [second first]", asynqdb.PendingKey(q), got)
		}
		if !rdb.SIsMember(ctx, asynqdb.AllQueues, q).Val() {
			t.Errorf("%s does not hold %q", asynqdb.AllQueues, q)
		}
		h := rdb.HGetAll(ctx, asynqdb.TaskKey(q, "first")).Val()
		want := asynqdb.Message{Type: "notify", Payload: payload, ID: "first", Queue: q, Retry: 7,
			Timeout: 90 * time.Second, Retention: time.Hour}.AppendTo(nil)
		if h["msg"] != string(want) {
			t.Errorf("msg:\n got %q\nwant %q", h["msg"], want)
		}
		if h["state"] != asynqdb.StatePending {
			t.Errorf("state %q, want %q", h["state"], asynqdb.StatePending)
		}
		if ns, err := strconv.ParseInt(h["pending_since"], 10, 64); err != nil || time.Since(time.Unix(0, ns)).Abs() > time.Minute {
			t.Errorf("pending_since %q, want now in Unix ns", h["pending_since"])
		}
		if len(h) != 3 {
			t.Errorf("task hash has fields %v, want msg, state, pending_since", keysOf(h))
		}
		// The default timeout, no retention.
		if _, err := client.Enqueue(asynq.NewTask("other", nil), asynq.TaskID("third"), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
		got := rdb.HGet(ctx, asynqdb.TaskKey(q, "third"), "msg").Val()
		if want := (asynqdb.Message{Type: "other", ID: "third", Queue: q, Retry: 25}).AppendTo(nil); got != string(want) {
			t.Errorf("msg with defaults:\n got %q\nwant %q", got, want)
		}
		// Headers, as the project's producers give every task (item 8).
		headers := map[string]string{"throttle-line": "0"}
		if _, err := client.Enqueue(asynq.NewTaskWithHeaders("other", nil, headers), asynq.TaskID("fourth"), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
		got = rdb.HGet(ctx, asynqdb.TaskKey(q, "fourth"), "msg").Val()
		if want := (asynqdb.Message{Type: "other", ID: "fourth", Queue: q, Retry: 25, Headers: headers}).AppendTo(nil); got != string(want) {
			t.Errorf("msg with headers:\n got %q\nwant %q", got, want)
		}
	})

	t.Run("dequeue", func(t *testing.T) {
		started, release := make(chan string, 3), make(chan struct{})
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel})
		err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			started <- id
			<-release
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown()
		defer close(release) // before Shutdown, which waits for the handler
		id := <-started
		if id != "first" {
			t.Errorf("dequeued %q first, want the head of pending (first)", id)
		}
		if got := rdb.LRange(ctx, asynqdb.ActiveKey(q), 0, -1).Val(); !slices.Equal(got, []string{id}) {
			t.Errorf("%s: %q, want [%s]", asynqdb.ActiveKey(q), got, id)
		}
		score, err := rdb.ZScore(ctx, asynqdb.LeaseKey(q), id).Result()
		if lease := time.Until(time.Unix(int64(score), 0)); err != nil || lease < 25*time.Second || lease > 31*time.Second {
			t.Errorf("%s score of %s: %v (%v from now), want about 30 s ahead", asynqdb.LeaseKey(q), id, score, lease)
		}
		h := rdb.HGetAll(ctx, asynqdb.TaskKey(q, id)).Val()
		if h["state"] != asynqdb.StateActive || h["pending_since"] != "" {
			t.Errorf("active task hash: state %q, pending_since %q; want %q and none", h["state"], h["pending_since"], asynqdb.StateActive)
		}
	})
}

// TestContractRetry checks item 6: a task its handler defers waits in the
// retry set, scored by the Unix second it is due, and wakes at a score
// rewritten while it waits; and Payload reads back what the Client wrote.
func TestContractRetry(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	const q = "contract"
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	payload := []byte(`{"provider":"sms"}`)
	task := asynq.NewTaskWithHeaders("notify", payload, map[string]string{"line": "0"})
	if _, err := client.Enqueue(task, asynq.TaskID("a"), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	key := asynqdb.TaskKey(q, "a")
	// Each run says it ran, with the header the run before it set.
	runs := make(chan string, 4)
	n := 0
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		n++
		runs <- task.Headers()["line"]
		if n == 1 {
			task.Headers()["line"] = "1" // item 8: kept with the task's retry
			return errors.New("not yet")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if line := <-runs; line != "0" {
		t.Errorf("the first run's header: %q, want the producer's %q", line, "0")
	}
	deadline := time.Now().Add(10 * time.Second)
	for rdb.HGet(ctx, key, "state").Val() != "retry" {
		if time.Now().After(deadline) {
			t.Fatalf("task never in retry: %v", rdb.HGetAll(ctx, key).Val())
		}
		time.Sleep(10 * time.Millisecond)
	}
	score, err := rdb.ZScore(ctx, asynqdb.RetryKey(q), "a").Result()
	if due := time.Until(time.Unix(int64(score), 0)); err != nil || score != float64(int64(score)) || due < 59*time.Minute || due > time.Hour {
		t.Errorf("%s score of a: %v (%v from now), %v; want a whole Unix second an hour ahead", asynqdb.RetryKey(q), score, due, err)
	}
	typ, got, err := asynqdb.Payload([]byte(rdb.HGet(ctx, key, "msg").Val()))
	if err != nil || typ != "notify" || string(got) != string(payload) {
		t.Errorf("Payload = %q, %q, %v; want notify, %q", typ, got, err, payload)
	}
	// Its score rewritten to now: the forwarder moves it to pending and it
	// runs again.
	rdb.ZAdd(ctx, asynqdb.RetryKey(q), redis.Z{Score: float64(time.Now().Unix() - 1), Member: "a"})
	select {
	case line := <-runs:
		if line != "1" {
			t.Errorf("the second run's header: %q, want the %q the first run set", line, "1")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the task did not run again once due")
	}
}

func keysOf(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
