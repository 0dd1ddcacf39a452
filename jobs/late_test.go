package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
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
	th := &Throttle{Limiter: lim, Metrics: NewMetrics(prometheus.NewRegistry()), Book: true, LateAfter: 100 * time.Millisecond,
		Policies: map[string]*throttle.Quota{"mkt": q}, Providers: map[string]Route{"gw": {Bucket: b}},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	route := func(id string) *job {
		j, err := th.route(context.Background(), id, Notification{Recipient: "bob", Policy: "mkt", Provider: "gw", Template: "hi"})
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
	if err := th.admit(ctx, b); !errors.As(err, &booked) || !booked.Booked {
		t.Fatalf("b: %v, want booked", err)
	}
	bAt := entryOf(t, rdb, "b")
	time.Sleep(20 * time.Millisecond)
	a.due = time.Now().Add(-300 * time.Millisecond)
	err := th.onTime(ctx, a)
	var again *Deferral
	if !errors.As(err, &again) || !again.Booked {
		t.Fatalf("late a: %v, want booked again", err)
	}
	if aAt := entryOf(t, rdb, "a"); aAt.Before(bAt.Add(2 * time.Second)) {
		t.Errorf("a is booked at %s, b at %s: want a a window after b", aAt, bAt)
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
