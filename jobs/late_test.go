package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// lateHarness is a Throttle with LateAfter, under a policy of 1 per 2s,
// booking, and a way to route a notification of bob's.
func lateHarness(t *testing.T) (*Throttle, *redis.Client, func(id string) *job) {
	t.Helper()
	rdb := shared.Server.ClientOn(t, shared.DB(t))
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: 2 * time.Second})
	b, _ := throttle.NewBucket("gw", 100, 10)
	th := &Throttle{
		Limiter: lim,
		Rules:   Rules{Policies: map[string]*throttle.Quota{"mkt": q}, Providers: map[string]Route{"gw": {Bucket: b}}},
		Metrics: NewMetrics(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pacing:  Pacing{Book: true, LateAfter: 100 * time.Millisecond},
	}
	route := func(id string) *job {
		j, err := th.route(context.Background(), id, message.Notification{Recipient: "bob", Policy: "mkt", Provider: "gw", Template: "hi"})
		if err != nil {
			t.Fatal(err)
		}
		return &j
	}
	return th, rdb, route
}

// entryOf returns the moment of task id's entry in bob's mkt quota.
func entryOf(t *testing.T, rdb *redis.Client, id string) time.Time {
	t.Helper()
	s, err := rdb.ZScore(context.Background(), keyspace.Quota(keyspace.Tag("throttle:", "bob"), "mkt"), id).Result()
	if err != nil {
		t.Fatalf("%s's entry: %v", id, err)
	}
	return time.UnixMicro(int64(s))
}

// TestLateSendTakesTheNextMoment: a job whose send would leave later than
// LateAfter after its moment gives its moment back and is admitted again,
// from now; one on time is left as it was.
func TestLateSendTakesTheNextMoment(t *testing.T) {
	th, rdb, route := lateHarness(t)
	ctx := context.Background()
	j := route("a")
	if err := th.admit(ctx, j); err != nil {
		t.Fatalf("a: %v", err)
	}
	at := entryOf(t, rdb, "a")
	if err := th.onTime(ctx, j); err != nil || !entryOf(t, rdb, "a").Equal(at) {
		t.Fatalf("on time: %v, entry %s -> %s; want nothing done", err, at, entryOf(t, rdb, "a"))
	}
	time.Sleep(20 * time.Millisecond) // Redis time moves on
	j.due = time.Now().Add(-300 * time.Millisecond)
	if err := th.onTime(ctx, j); err != nil {
		t.Fatalf("late: %v", err)
	}
	if moved := entryOf(t, rdb, "a").Sub(at); moved < 20*time.Millisecond {
		t.Errorf("late: the entry moved by %s, want to the new admission, 20ms or more later", moved)
	}
	if n := testutil.ToFloat64(th.Metrics.LateSends); n != 1 {
		t.Errorf("%v late sends, want 1", n)
	}
}

// TestLateSendGoesAfterTheNextMessage: a job about to go late, whose
// recipient's next message was booked a window after its moment, does not
// go: it gives back its entry and books again, after that message.
func TestLateSendGoesAfterTheNextMessage(t *testing.T) {
	th, rdb, route := lateHarness(t)
	ctx := context.Background()
	a, b := route("a"), route("b")
	if err := th.admit(ctx, a); err != nil {
		t.Fatalf("a: %v", err)
	}
	var booked *Deferral
	if err := th.admit(ctx, b); !errors.As(err, &booked) || !booked.Exact {
		t.Fatalf("b: %v, want booked", err)
	}
	bAt := entryOf(t, rdb, "b")
	time.Sleep(20 * time.Millisecond)
	a.due = time.Now().Add(-300 * time.Millisecond)
	err := th.onTime(ctx, a)
	var again *Deferral
	if !errors.As(err, &again) || !again.Exact {
		t.Fatalf("late a: %v, want booked again", err)
	}
	if aAt := entryOf(t, rdb, "a"); aAt.Before(bAt.Add(2 * time.Second)) {
		t.Errorf("a is booked at %s, b at %s: want a a window after b", aAt, bAt)
	}
}

// slowReplies is a hook that, while on, holds each script call's reply
// for stall after Redis ran it: a worker stopped or starved between the
// script and the reading of its answer.
type slowReplies struct {
	on    atomic.Bool
	stall time.Duration
}

func (s *slowReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		s.hold(cmd)
		return err
	}
}

func (s *slowReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			s.hold(cmd)
		}
		return err
	}
}

// hold stalls after a script call, while on.
func (s *slowReplies) hold(cmd redis.Cmder) {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		if s.on.Load() {
			time.Sleep(s.stall) // the stall being simulated, not a wait for an event
		}
	}
}

// TestLateFromTheCall: a job whose admission's answer was read a stall
// after Redis decided it counts its lateness from the call, so a send
// about to leave that late is admitted again; counted from the answer, it
// would look on time.
func TestLateFromTheCall(t *testing.T) {
	th, rdb, route := lateHarness(t)
	slow := &slowReplies{stall: 300 * time.Millisecond}
	rdb.AddHook(slow)
	ctx := context.Background()
	j := route("a")
	slow.on.Store(true)
	if err := th.admit(ctx, j); err != nil {
		t.Fatalf("a: %v", err)
	}
	slow.on.Store(false)
	at := entryOf(t, rdb, "a")
	if err := th.onTime(ctx, j); err != nil {
		t.Fatalf("onTime: %v", err)
	}
	if n := testutil.ToFloat64(th.Metrics.LateSends); n != 1 {
		t.Errorf("%v late sends, want 1: the answer came %s after Redis's moment", n, slow.stall)
	}
	if moved := entryOf(t, rdb, "a").Sub(at); moved < slow.stall {
		t.Errorf("the entry moved by %s, want to the new admission, %s or more later", moved, slow.stall)
	}
}

// TestRerunHoldingPastMoments: without booking, a job run again (its
// worker died after its admission) finds its takes held at the moment the
// earlier run was given. While that run's provider slot holds, the run
// again is a repeat and keeps them (it may be another worker's run, about
// to send); once the slot has ended it gives them back and is admitted
// again from now, rather than going now against that moment.
func TestRerunHoldingPastMoments(t *testing.T) {
	th, rdb, route := lateHarness(t)
	th.Book = false
	ctx := context.Background()
	if err := th.admit(ctx, route("a")); err != nil {
		t.Fatalf("a: %v", err)
	}
	at := entryOf(t, rdb, "a")
	again := route("a") // the run a worker that took the task over makes
	if err := th.admit(ctx, again); err != nil || !entryOf(t, rdb, "a").Equal(at) || again.bumps != 0 {
		t.Fatalf("a again within its slot: %v, entry %s -> %s, admitted again %d times; want it kept",
			err, at, entryOf(t, rdb, "a"), again.bumps)
	}
	// The slot (100/s: 10 ms) ends by Redis's clock.
	for deadline := time.Now().Add(5 * time.Second); ; {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.After(at.Add(20 * time.Millisecond)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis time %s still before %s", now, at.Add(20*time.Millisecond))
		}
		time.Sleep(5 * time.Millisecond)
	}
	later := route("a")
	if err := th.admit(ctx, later); err != nil {
		t.Fatalf("a after its slot: %v", err)
	}
	if got := entryOf(t, rdb, "a"); !got.After(at.Add(20 * time.Millisecond)) {
		t.Errorf("a run again after its slot holds its entry at %s, the earlier run's %s: want it admitted again, from now", got, at)
	}
	if later.bumps != 1 {
		t.Errorf("a run again after its slot was admitted again %d times, want once", later.bumps)
	}
}

// TestReadmitTakesTheRulesOfNow: a job admitted again within its run (here
// about to go late) is admitted on the rules as they are now, not on those
// it was routed with: a provider's rate lowered by a reload while it slept
// spaces it at the new pace.
func TestReadmitTakesTheRulesOfNow(t *testing.T) {
	th, _, route := lateHarness(t)
	ctx := context.Background()
	j := route("a")
	if err := th.admit(ctx, j); err != nil {
		t.Fatalf("a: %v", err)
	}
	slow, _ := throttle.NewBucket("gw", 5, 1)
	th.Swap(Rules{Policies: th.Policies, Providers: map[string]Route{"gw": {Bucket: slow}}})
	j.due = time.Now().Add(-300 * time.Millisecond)
	if err := th.onTime(ctx, j); err != nil {
		t.Fatalf("late: %v", err)
	}
	if j.route.Bucket != slow {
		t.Errorf("admitted again on the bucket %s, want the one swapped in (%s)", j.route.Bucket, slow)
	}
	if j.bumps != 1 {
		t.Errorf("%d bumps after one late send, want 1 (kept across the new rules)", j.bumps)
	}
}
