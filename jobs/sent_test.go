package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// redeliver runs the handler for task id again with the same payload, as
// asynq does when a worker dies after the send but before asynq marks the
// task done: the completed task is deleted and enqueued again under its ID.
func (h *harness) redeliver(t *testing.T, id string, n message.Notification) *asynq.TaskInfo {
	t.Helper()
	if err := h.insp.DeleteTask("default", id); err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	h.enqueue(t, id, n)
	return h.await(t, id, "completed again", state(asynq.TaskStateCompleted))
}

// counterValue reads one counter of v.
func counterValue(t *testing.T, v *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	if err := v.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func (h *harness) sendCount(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sends[id]
}

// TestRedeliveredSentJobIsNotSentAgain: a job whose send succeeded and is
// delivered again completes without a second send, without taking quota or
// a provider token again, and without giving back what it took. Without the
// markers the same redelivery is sent twice.
func TestRedeliveredSentJobIsNotSentAgain(t *testing.T) {
	t.Parallel()
	for _, marks := range []bool{true, false} {
		name := map[bool]string{true: "with markers", false: "without markers"}[marks]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 1000, 100)
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, noMarks: !marks})
			n := message.Notification{Recipient: "alice"}
			h.enqueue(t, "once", n)
			h.await(t, "once", "completed", state(asynq.TaskStateCompleted))
			info := h.redeliver(t, "once", n)

			want := map[bool]int{true: 1, false: 2}[marks]
			if got := h.sendCount("once"); got != want {
				t.Errorf("provider got the job %d times, want %d", got, want)
			}
			if info.LastErr != "" || info.Retried != 0 {
				t.Errorf("the redelivery did not simply complete: %+v", info)
			}
			if got := quotaSize(t, h, "alice"); got != 1 {
				t.Errorf("alice's quota holds %d entries after the redelivery, want the first delivery's 1", got)
			}
			m := h.th.Metrics
			admitted := counterValue(t, m.Admitted, "mkt", "gw")
			dups := counterValue(t, m.Duplicates, "gw")
			if wantAdmitted, wantDups := map[bool]float64{true: 1, false: 2}[marks], map[bool]float64{true: 1, false: 0}[marks]; admitted != wantAdmitted || dups != wantDups {
				t.Errorf("admitted %v, duplicates skipped %v; want %v and %v", admitted, dups, wantAdmitted, wantDups)
			}
			if !marks {
				return
			}
			if at, ok, err := h.th.Sent.SentAt(context.Background(), "once"); err != nil || !ok || time.Since(at) > time.Minute {
				t.Errorf("marker: %s %v %v; want the send's time, just now", at, ok, err)
			}
			// The marker outlives any redelivery asynq makes.
			keys := h.rdb.Keys(context.Background(), "*done:{once}").Val()
			if len(keys) != 1 {
				t.Fatalf("marker keys %q, want one", keys)
			}
			ttl := h.rdb.PTTL(context.Background(), keys[0]).Val()
			if ttl <= defaultSentTTL-time.Minute || ttl > defaultSentTTL {
				t.Errorf("marker TTL %s, want about %s", ttl, defaultSentTTL)
			}
		})
	}
}

// TestFailedSendLeavesNoMarker: only an acknowledged send is marked, so a
// job whose send failed is sent when it is retried.
func TestFailedSendLeavesNoMarker(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b,
		retryDelay: func(int, error, *asynq.Task) time.Duration { return 0 }})
	failed := false
	h.fail = func(m providers.Message) error {
		if !failed {
			failed = true
			return errors.New("503 Service Unavailable")
		}
		return nil
	}
	h.enqueue(t, "flaky", message.Notification{Recipient: "bob"})
	info := h.await(t, "flaky", "completed", state(asynq.TaskStateCompleted))
	if info.Retried != 1 || h.sendCount("flaky") != 1 {
		t.Errorf("retried %d times, sent %d times; want 1 and 1", info.Retried, h.sendCount("flaky"))
	}
	if d := counterValue(t, h.th.Metrics.Duplicates, "gw"); d != 0 {
		t.Errorf("the retry after a failed send was taken for a duplicate (%v)", d)
	}
}

// TestSentMarkerCheckFailureDefers: when the marker cannot be read (Redis
// unreachable until the task's context ends), the job is deferred, not sent
// blind and not failed. The marker is read by the admission, so this is the
// admission failing.
func TestSentMarkerCheckFailureDefers(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	rdb := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	th := &Throttle{
		Limiter: lim,
		Rules:   Rules{Policies: map[string]*throttle.Quota{"mkt": q}, Providers: map[string]Route{"gw": {Bucket: b}}},
		Sent:    NewSentMarks(lim),
		Metrics: NewMetrics(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	j, err := th.route(context.Background(), "x", message.Notification{Recipient: "alice", Policy: "mkt", Provider: "gw", Template: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if !j.request().CheckDone {
		t.Fatalf("the admission does not check the marker: %+v", j.request())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err = th.admit(ctx, &j)
	var d *Deferral
	if !errors.As(err, &d) || IsFailure(err) {
		t.Errorf("failed check gave %v; want a deferral", err)
	}
}
