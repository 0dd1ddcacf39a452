//go:build integration

package jobs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redisguard"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

var measure = flag.Bool("measure", false, "also run the slow measurements (minutes each)")

// guarded wraps a worker's client in a redisguard.Guard, as cmd/worker does.
func guarded(rdb *redis.Client) *redis.Client {
	redisguard.New(slog.New(slog.NewTextHandler(io.Discard, nil)), redisguard.Options{}).Install(rdb)
	return rdb
}

// produce enqueues n notifications for recipients r0..r(k-1), one every
// gap, retrying each until Redis takes it (as a producer must while Redis
// restarts), and returns their IDs once all are in. It may run on a
// goroutine of its own.
func (h *harness) produce(t *testing.T, n, k int, gap time.Duration) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("job-%03d", i)
		task, err := message.NewTask(message.Notification{Recipient: fmt.Sprintf("r%d", i%k), Policy: "mkt", Provider: "gw", Template: "t"},
			id, asynq.Retention(time.Hour))
		if err != nil {
			t.Error(err) // not Fatal: produce may run on its own goroutine
			return ids
		}
		for deadline := time.Now().Add(30 * time.Second); ; {
			_, err := h.client.Enqueue(task)
			// A conflict: an earlier try went in but its reply was lost.
			if err == nil || errors.Is(err, asynq.ErrTaskIDConflict) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("enqueue %s: %v", id, err)
				return ids
			}
			time.Sleep(50 * time.Millisecond)
		}
		ids = append(ids, id)
		time.Sleep(gap)
	}
	return ids
}

// TestRedisRestartAndFlushesMidRun streams jobs through a worker while its
// Redis has its scripts and functions flushed, is restarted, and is killed
// (-9) and restarted at once. Redis keeps an append-only file, as a
// production Redis must for asynq's queue to survive a restart (without
// persistence a restart loses every queued job). Every job is delivered,
// once; the worker's client reconnects and reloads its scripts by itself
// (go-redis's retries absorb outages this short); every recipient's quota
// holds exactly its delivered jobs, so no admission leaked or was lost.
// Jobs are produced faster than the bucket lets them go, so some are in
// flight at every fault.
func TestRedisRestartAndFlushesMidRun(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 100, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 50, 5) // a backlog: jobs are in flight at every fault
	srv := redistest.StartDurable(t)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, inlineWait: time.Second, server: srv, wrap: guarded,
		latency: 30 * time.Millisecond}) // so that sends are in flight when Redis goes
	const jobs, recipients = 300, 30

	// Jobs go in from another goroutine, retried while Redis is away.
	var ids []string
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		ids = h.produce(t, jobs, recipients, 5*time.Millisecond)
	}()
	admin := srv.Client(t)
	ctx := context.Background()
	flush := func() {
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Errorf("SCRIPT FLUSH: %v", err)
		}
		if err := admin.FunctionFlush(ctx).Err(); err != nil {
			t.Errorf("FUNCTION FLUSH: %v", err)
		}
	}
	// Each fault waits for 25 more sends since the last one (about half a
	// second at the bucket's 50/s), so every fault finds the worker busy,
	// however slow the machine.
	busy := func() { h.awaitSent(t, h.sentCount()+25, time.Minute) }
	busy()
	flush()
	busy()
	srv.Restart(t) // SIGTERM: Redis writes its AOF and exits
	busy()
	srv.Kill() // SIGKILL: only the fsynced AOF survives
	srv.Restart(t)
	busy()
	flush()
	<-produced
	// Usually done in seconds. A task whose dequeue reply the kill cut off
	// sits in the active set until asynq's recoverer finds its lease
	// expired, 1-2 minutes later: delayed, not lost.
	h.awaitAll(t, ids, 3*time.Minute)

	h.checkDelivered(t, ids, recipients)
}

// checkDelivered checks that each of ids was sent once, or more only where
// its sent marker could not be written, that none panicked, and that each
// recipient's quota holds exactly its jobs (job i went to recipient
// i%recipients). It returns how many were sent more than once.
func (h *harness) checkDelivered(t *testing.T, ids []string, recipients int) int {
	t.Helper()
	var dups []string
	interrupted, recovered := 0, 0 // jobs that failed or were deferred on the way; of those, redelivered
	for _, id := range ids {
		info, _ := h.insp.GetTaskInfo("default", id)
		if info != nil && info.LastErr != "" {
			interrupted++
		}
		if info != nil && info.LastErr == asynq.ErrLeaseExpired.Error() {
			recovered++
		}
		if info != nil && strings.Contains(info.LastErr, "panic") {
			t.Errorf("%s: %s", id, info.LastErr)
		}
		if n := h.sendCount(id); n != 1 {
			dups = append(dups, fmt.Sprintf("%s sent %d times", id, n))
		}
	}
	unmarked := int(counterValue(t, h.th.Metrics.Unmarked, "gw"))
	skipped := counterValue(t, h.th.Metrics.Duplicates, "gw")
	t.Logf("%d jobs, %d interrupted on the way, %d of them redelivered by asynq's recoverer: %d sent more than once, %d sends unmarked, %v redeliveries skipped as already sent",
		len(ids), interrupted, recovered, len(dups), unmarked, skipped)
	if h.th.Sent != nil && len(dups) > unmarked {
		t.Errorf("%d jobs sent more than once, more than the %d sends whose marker failed: %v", len(dups), unmarked, dups)
	}
	ctx := context.Background()
	for r := range recipients {
		recipient := fmt.Sprintf("r%d", r)
		var want []string
		for i, id := range ids {
			if i%recipients == r {
				want = append(want, id)
			}
		}
		got, err := h.rdb.ZRange(ctx, "throttle:{"+recipient+"}:q:mkt", 0, -1).Result()
		if err != nil {
			t.Fatalf("read %s's quota: %v", recipient, err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s's quota holds %v, want its delivered jobs %v", recipient, got, want)
		}
	}
	return len(dups)
}

// TestRedisOutageLosesNothing kills Redis for 5s under a worker with a
// backlog: longer than go-redis's retries absorb, shorter than asynq's
// lease. Every handler in flight waits for Redis (outage.go) instead of
// returning into the outage, so none hands asynq a result to lose and none
// is sent twice. The kill itself may cost the result of the one task being
// dequeued at that instant and of tasks whose completion was on its way;
// their markers stop a second send. So: at most one lost task whose handler
// had not returned before Redis came back, and no handler that sent after
// Redis died returns before it is back. With -measure it also runs without
// markers, whose redelivered tasks are sent again.
func TestRedisOutageLosesNothing(t *testing.T) {
	t.Parallel()
	for _, marks := range []bool{true, false} {
		t.Run(map[bool]string{true: "with markers", false: "without markers"}[marks], func(t *testing.T) {
			if !marks && !*measure {
				t.Skip("a measurement of minutes: run with -measure")
			}
			t.Parallel()
			q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 100, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 50, 5)
			srv := redistest.StartDurable(t)
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, inlineWait: time.Second, server: srv,
				wrap: guarded, latency: 30 * time.Millisecond, noMarks: !marks})
			const jobs, recipients = 200, 20
			ids := h.produce(t, jobs, recipients, 0)
			// The kill must find the worker sending at the bucket's pace,
			// not starting: an idle asynq server polls every 0.5-1.5 s,
			// and its first poll takes the bucket's burst at once.
			h.awaitSent(t, 35, 30*time.Second)
			srv.Kill() // returns once the process has exited
			dead := time.Now()
			time.Sleep(5 * time.Second) // the outage's length is what is under test
			back := time.Now()
			srv.Restart(t)
			h.awaitAll(t, ids, 4*time.Minute)
			var lost, orphans, early []string
			for _, id := range ids {
				returned, ok := h.firstReturn(id)
				if ok && returned.Before(back) {
					if sent, ok := h.sentAt(id); ok && sent.After(dead) {
						early = append(early, id)
					}
				}
				info, _ := h.insp.GetTaskInfo("default", id)
				if info == nil || info.LastErr != asynq.ErrLeaseExpired.Error() {
					continue
				}
				lost = append(lost, id)
				if !ok || !returned.Before(back) {
					orphans = append(orphans, id)
				}
			}
			dups := h.checkDelivered(t, ids, recipients)
			t.Logf("results lost: %v (of them, handlers that had not returned before Redis was back: %v); handlers that sent after Redis died and returned before it was back: %v",
				lost, orphans, early)
			if !marks {
				return
			}
			if len(early) > 0 {
				t.Errorf("handlers of %v sent after Redis died and returned before it was back: they cannot have written their markers", early)
			}
			if len(orphans) > 1 {
				t.Errorf("results lost of tasks whose handlers had not returned before Redis was back: %v; the kill explains one at most", orphans)
			}
			if dups > 0 {
				t.Errorf("a 5s outage sent %d jobs twice", dups)
			}
		})
	}
}
