package jobs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/throttle"
)

// stallOnce is a Holder whose first answer takes stall: the worker stalls
// between a job's admission and its send, as a busy machine, a long GC or
// a slow Redis make it.
type stallOnce struct {
	stall time.Duration

	mu    sync.Mutex
	ended time.Time // when the stall ended; zero before
}

func (s *stallOnce) Holds(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended.IsZero() {
		time.Sleep(s.stall)
		s.ended = time.Now()
	}
	return nil
}

// TestHandlerLateJobIsAdmittedAgain: a job that stalls 300 ms between its
// admission and its send goes only once admitted again from now when
// Throttle.SendWithin is shorter than the stall, so that its recipient's
// quota entry is the moment it went, not 300 ms before; without
// SendWithin it goes with the entry of its first admission.
func TestHandlerLateJobIsAdmittedAgain(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	for _, tc := range []struct {
		name       string
		sendWithin time.Duration
		late       float64 // the bookings{event="late"} it counts
	}{
		{"admitted again", 50 * time.Millisecond, 1},
		{"no limit", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 1000, 100)
			holder := &stallOnce{stall: stall}
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, holder: holder})
			h.th.SendWithin = tc.sendWithin
			h.enqueue(t, "x", Notification{Recipient: "alice"})
			h.await(t, "x", "completed", state(asynq.TaskStateCompleted))
			h.mu.Lock()
			n := h.sends["x"]
			h.mu.Unlock()
			if n != 1 {
				t.Fatalf("sent %d times, want once", n)
			}
			if n := counterValue(t, h.th.Metrics.Bookings, "late"); n != tc.late {
				t.Errorf("bookings late %g, want %g", n, tc.late)
			}
			zs := h.rdb.ZRangeWithScores(context.Background(), "throttle:{alice}:q:mkt", 0, -1).Val()
			if len(zs) != 1 {
				t.Fatalf("alice's quota holds %d entries, want 1", len(zs))
			}
			entry := time.UnixMicro(int64(zs[0].Score))
			holder.mu.Lock()
			afterStall := !entry.Before(holder.ended.Add(-5 * time.Millisecond))
			holder.mu.Unlock()
			if afterStall != (tc.sendWithin > 0) {
				t.Errorf("quota entry at %s, the stall ended %s: entry after the stall %t, want %t",
					entry.Format("15:04:05.000"), holder.ended.Format("15:04:05.000"), afterStall, tc.sendWithin > 0)
			}
		})
	}
}
