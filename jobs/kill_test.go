//go:build integration

package jobs

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

var killLatency = flag.Duration("killlatency", 20*time.Millisecond, "TestKillMeasure: the provider's answer latency")

// acceptingProvider is a webhook endpoint that takes every message the
// moment it arrives (counting it per Idempotency-Key) and answers after a
// latency: a worker killed in between leaves a sent message unacknowledged.
type acceptingProvider struct {
	latency time.Duration

	mu       sync.Mutex
	accepted map[string]int
}

func (p *acceptingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.accepted[r.Header.Get("Idempotency-Key")]++
	p.mu.Unlock()
	time.Sleep(p.latency)
	w.WriteHeader(http.StatusAccepted)
}

// duplicates returns how many messages were taken more than once, and the
// extra copies.
func (p *acceptingProvider) duplicates() (messages, copies int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.accepted {
		if n > 1 {
			messages++
			copies += n - 1
		}
	}
	return messages, copies
}

// TestKillMeasure measures what the sent markers do for a worker killed with
// SIGKILL mid-run. Worker processes (this test binary, TestKillChild) are
// killed at random moments while a backlog drains through a webhook
// provider; a last worker then runs until asynq's recoverer has brought
// back every task the dead ones held (1-2 minutes). It counts messages the
// provider took twice, with and without markers. Run with -measure.
func TestKillMeasure(t *testing.T) {
	if !*measure {
		t.Skip("a measurement of minutes: run with -measure")
	}
	for _, marks := range []bool{true, false} {
		t.Run(fmt.Sprintf("markers=%t", marks), func(t *testing.T) {
			t.Parallel()
			const jobs, kills = 3000, 8
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			provider := &acceptingProvider{latency: *killLatency, accepted: map[string]int{}}
			endpoint := httptest.NewServer(provider)
			defer endpoint.Close()
			client := asynq.NewClientFromRedisClient(rdb)
			for i := range jobs {
				task, err := message.NewTask(message.Notification{Recipient: fmt.Sprintf("r%d", i), Policy: "mkt", Provider: "gw", Template: "t"},
					fmt.Sprintf("job-%04d", i), asynq.Retention(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := client.Enqueue(task); err != nil {
					t.Fatal(err)
				}
			}
			start := func() *exec.Cmd {
				cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$")
				cmd.Env = append(os.Environ(), "KILL_CHILD_ADDR="+srv.Addr, "KILL_CHILD_URL="+endpoint.URL,
					fmt.Sprintf("KILL_CHILD_MARKS=%t", marks))
				cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				return cmd
			}
			for range kills {
				w := start()
				time.Sleep(500*time.Millisecond + rand.N(time.Second)) // a random moment to kill at
				_ = w.Process.Kill()
				_ = w.Wait()
			}
			last := start()
			insp := asynq.NewInspectorFromRedisClient(rdb)
			began := time.Now()
			for {
				qi, err := insp.GetQueueInfo("default")
				if err == nil && qi.Completed == jobs {
					break
				}
				if time.Since(began) > 4*time.Minute {
					t.Fatalf("not all jobs completed: %+v, %v", qi, err)
				}
				time.Sleep(time.Second)
			}
			_ = last.Process.Signal(syscall.SIGTERM)
			_ = last.Wait()
			recovered := 0
			for i := range jobs {
				info, err := insp.GetTaskInfo("default", fmt.Sprintf("job-%04d", i))
				if err == nil && info.LastErr == asynq.ErrLeaseExpired.Error() {
					recovered++
				}
			}
			messages, copies := provider.duplicates()
			t.Logf("markers %t, provider latency %s: %d jobs, %d SIGKILLs: %d tasks recovered from dead workers, %d messages taken twice (%d extra copies)",
				marks, *killLatency, jobs, kills, recovered, messages, copies)
		})
	}
}

// TestKillChild is a worker process for TestKillMeasure; it does nothing
// unless run by it (KILL_CHILD_ADDR set). It runs until killed, or until
// SIGTERM, which shuts it down gracefully.
func TestKillChild(t *testing.T) {
	addr := os.Getenv("KILL_CHILD_ADDR")
	if addr == "" {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 10, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 500, 20)
	stopping := make(chan struct{})
	th := &Throttle{
		Limiter: lim,
		Rules: Rules{Policies: map[string]*throttle.Quota{"mkt": q}, Providers: map[string]Route{"gw": {Bucket: b,
			Provider: providers.NewWebhook("gw", os.Getenv("KILL_CHILD_URL"), 5*time.Second, nil, nil)}}},
		Stopping: stopping,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pacing:   Pacing{InlineWait: time.Second},
	}
	if os.Getenv("KILL_CHILD_MARKS") == "true" {
		th.Sent = NewSentMarks(lim)
	}
	srv := startWorker(t, rdb, th, asynq.Config{Concurrency: 20, LogLevel: asynq.FatalLevel})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	close(stopping)
	srv.Shutdown()
}
