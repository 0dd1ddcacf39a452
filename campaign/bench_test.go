package campaign

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
)

// BenchmarkFanout fans a 100k-recipient audience file out, and enqueues
// the same 100k notification tasks with a plain loop of asynq's
// Client.Enqueue, and with 16 goroutines calling it, on one redis-server,
// in the same run. It reports notifications enqueued per second for each
// and the fan-out's speed-up over the plain loop ("x_loop").
func BenchmarkFanout(b *testing.B) {
	const n = 100_000
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	audience := lines(n)
	r := newRunner(b, testConfig(b, srv.Addr, testCampaign, audience), rdb, Options{})
	client := asynq.NewClientFromRedisClient(rdb)
	recipients := strings.Fields(audience)
	ctx := context.Background()

	// tasks returns the notifications the fan-out of tick enqueues, built
	// as a producer would, one at a time.
	task := func(tick Tick, rcpt string) *asynq.Task {
		t, err := message.NewTask(message.Notification{Recipient: rcpt, Policy: "weekly", Provider: "console",
			Template: "digest", Data: json.RawMessage(`{"title":"Your week"}`), Campaign: tick.String()},
			tick.NotificationID(rcpt), asynq.Queue("default"))
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	var fanout, loop, pool time.Duration
	for i := range b.N {
		tick := NewTick("digest", time.Now().Add(-time.Duration(i+1)*time.Second))

		rdb.FlushAll(ctx)
		start := time.Now()
		if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
			b.Fatal(err)
		}
		fanout += time.Since(start)
		if p, _ := r.Progress(ctx, tick); p.Enqueued != n {
			b.Fatalf("fan-out enqueued %d, want %d", p.Enqueued, n)
		}

		rdb.FlushAll(ctx)
		start = time.Now()
		for _, rcpt := range recipients {
			if _, err := client.Enqueue(task(tick, rcpt)); err != nil {
				b.Fatal(err)
			}
		}
		loop += time.Since(start)

		rdb.FlushAll(ctx)
		start = time.Now()
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := w; j < n; j += 16 {
					if _, err := client.Enqueue(task(tick, recipients[j])); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		pool += time.Since(start)
		if got := rdb.LLen(ctx, "asynq:{default}:pending").Val(); got != n {
			b.Fatalf("pool enqueued %d, want %d", got, n)
		}
	}
	rate := func(d time.Duration) float64 { return float64(n*b.N) / d.Seconds() }
	b.ReportMetric(rate(fanout), "fanout/s")
	b.ReportMetric(rate(loop), "loop/s")
	b.ReportMetric(rate(pool), "pool16/s")
	b.ReportMetric(rate(fanout)/rate(loop), "x_loop")
	b.ReportMetric(rate(fanout)/rate(pool), "x_pool16")
}
