package feedback

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/lifecycle"
)

// TestFailedApplyIsRetried: a request whose reports could not be applied
// (the histories' Redis did not answer) fails, leaves no claim behind, and
// the provider's retry of it applies them.
func TestFailedApplyIsRetried(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing answers there
	down := redis.NewClient(&redis.Options{Addr: dead, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { down.Close() })
	healthy := f.rc.applier.events
	f.rc.applier.events = lifecycle.NewRecorder(down, lifecycle.Options{})
	req := f.sendgrid(t, recently(), sendgridBatch(sgEvent("bounce", "m1", "a@example.com", `"type":"bounce"`)))
	if _, err := f.receive(req); err == nil || errors.Is(err, ErrReplayed) {
		t.Fatalf("Receive with the histories' Redis down: %v, want its error", err)
	}
	if n := len(f.suppressed(t, "grid")); n != 0 {
		t.Errorf("%d addresses suppressed by a request that failed", n)
	}
	f.rc.applier.events = healthy
	if res, err := f.receive(req); err != nil || res.Applied != 1 {
		t.Errorf("the retry: %+v, %v; want it applied", res, err)
	}
	if got := f.types(t, "m1"); len(got) != 1 || got[0] != lifecycle.Bounced {
		t.Errorf("history %v, want the bounce once", got)
	}
}

// TestMarksExpire: a report's mark lives Remember, and the claim of one
// being applied claimTTL: Redis forgets both.
func TestMarksExpire(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "")
	req := f.sendgrid(t, recently(), sendgridBatch(sgEvent("delivered", "m1", "a@example.com", "")))
	if _, err := f.receive(req); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys, err := f.rdb.Keys(ctx, "throttle:feedback:{*}").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("marks %v, %v; want one", keys, err)
	}
	if v, ttl := f.rdb.Get(ctx, keys[0]).Val(), f.rdb.PTTL(ctx, keys[0]).Val(); v != applied || ttl <= DefaultRemember-time.Minute || ttl > DefaultRemember {
		t.Errorf("mark %q for %s, want %q for about %s", v, ttl, applied, DefaultRemember)
	}
	want := lifecycle.IDOf(lifecycle.Event{Type: lifecycle.Delivered, Message: "m1", ProviderMessageID: "xmsg-m1"})
	if keys[0] != markKey("throttle:", want) {
		t.Errorf("mark %s, want the delivered event's ID %s", keys[0], want)
	}
}

// TestMetrics: what each report did, and each refusal, is counted by
// provider.
func TestMetrics(t *testing.T) {
	f := newFixture(t)
	f.accepted(t, "m1", "")
	body := sendgridBatch(sgEvent("delivered", "m1", "a@example.com", ""), sgEvent("open", "m1", "a@example.com", ""),
		sgEvent("delivered", "m9", "z@example.com", ""))
	if _, err := f.receive(f.sendgrid(t, recently(), body)); err != nil {
		t.Fatal(err)
	}
	_, _ = f.receive(f.sendgrid(t, recently(), body))
	_, _ = f.receive(Request{Provider: "grid", Body: body})
	for labels, want := range map[[2]string]float64{{"grid", "delivered"}: 1, {"grid", "ignored"}: 2, {"grid", "unknown"}: 1, {"grid", "replayed"}: 2} {
		if got := testutil.ToFloat64(f.metrics.Reports.WithLabelValues(labels[0], labels[1])); got != want {
			t.Errorf("reports %v: %v, want %v", labels, got, want)
		}
	}
	if got := testutil.ToFloat64(f.metrics.Refused.WithLabelValues("grid", "signature")); got != 1 {
		t.Errorf("refused for their signature: %v, want 1", got)
	}
}
