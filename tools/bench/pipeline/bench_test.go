// Package pipeline holds the end-to-end benchmarks of the worker pipeline, run
// by `make bench`:
//
//	cd tools && go test -run '^$' -bench . -benchmem ./bench/pipeline/
//
// It lives in the tools module, with the chart drawing's dependency
// (golang.org/x/image), which the product does not need.
//
// Each benchmark starts a redis-server of its own (internal/redistest), runs
// real asynq servers on it and delivers through the webhook provider to an
// HTTP server in this process, which records what arrived and when:
//
//	BenchmarkThroughputVsPlain  tasks/s with the throttle and without, side by side,
//	                            in ABBA rounds: throttled/plain (target >= 0.85)
//	BenchmarkWorkerVsBare       the same black-box: 2 built workers against 2 bare asynq
//	                            workers (tools/bench/bareworker) doing the same POST:
//	                            worker/bare (>= 0.85) and Redis commands per task (<= 28)
//	BenchmarkPacing             2 worker processes drain 4000 jobs through a provider of
//	                            200/s burst 20: delivered/s (>= 190), the most that arrive
//	                            in any 1 s (<= 220), admission calls per message (<= 1.5),
//	                            and a chart (docs/pacing.png, or $PACING_CHART)
//	BenchmarkKillToHandover     a worker killed with -9 while its sends wait for a slow
//	                            provider: seconds from the kill until another worker sends
//	                            them, p50 and max over the kills (target <= 10)
//	BenchmarkBacklog            booking under backlogs of 1k, 10k, 100k on a 20/s provider:
//	                            admission calls and Redis commands per delivered message,
//	                            delivered/rate, booking lateness, MEMORY USAGE of its keys
//	BenchmarkRecipientBurst     20 recipients x 20 messages at 1 per 2 s + 3 per 10 s, at
//	                            inline_wait 0, 1 s and 2.5 s: admission calls per message,
//	                            delivered/allowed, order
//	BenchmarkPriority           critical-queue latency behind a booked bulk backlog
//	BenchmarkFairShare          a small tenant behind a big one's backlog at concurrency
//	                            20 and 40, burst 20 and 2: its completion time and both
//	                            rates; admission calls per message with 1 and with 1000
//	                            tenants
//	BenchmarkRateChange         a provider's rate changed by SIGHUP with work waiting:
//	                            raised 2/s -> 20/s, the drain time; lowered 20/s -> 5/s,
//	                            the excess over the new bucket, admission calls per message
//	BenchmarkCallbacks          what events cost: off, the history alone, status callbacks to
//	                            a local receiver, and to an endpoint that never answers: Redis
//	                            commands per message, the send path and the handler's time at
//	                            a paced 300/s (events must not lengthen the send path)
//
// Targets are reported, not asserted, because on a shared machine they
// measure the machine as much as the code. What fails a benchmark is a
// broken invariant, since then its numbers describe something else than
// they claim: a job lost, delivered twice, or left deferred, failed or
// archived; a worker that delivered nothing or did not stop cleanly; a
// bucket that gave out more than rate + burst tokens in 1 s of Redis time.
//
// Flags (after -args): -e2e.tasks, -e2e.rounds, -e2e.floor, -e2e.servers,
// -e2e.pool for the throughput benchmark, -bare.tasks, -bare.rounds,
// -bare.nodead, -bare.queues for the black-box one, -pacing.concurrency for pacing,
// -handover.kills for the hand-over, -backlog.sizes, -backlog.period,
// -backlog.concurrency for the booking ones, -fair.big, -fair.small,
// -fair.sent, -fair.concurrency, -fair.burst, -fair.jobs, -fair.keys for the
// fair share, -repace.raised, -repace.lowered for the rate change,
// -callbacks.tasks, -callbacks.rounds, -callbacks.paced, -callbacks.rate for
// the callbacks,
// -burst.inline_wait and -burst.monitor (a file to record every command the
// recipient burst's Redis runs in, for the diagnosis of a broken window).
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
)

const (
	benchQueue    = "default"
	benchPolicy   = "marketing" // 1 per 24h and 3 per 168h, as in config.yaml
	benchProvider = "hook"
	benchTemplate = "welcome"
)

// webhook is the provider's end of the line: an HTTP server that accepts
// every POST and records when each message, by its Idempotency-Key,
// arrived. It stands for a provider that is never the bottleneck.
type webhook struct {
	srv *httptest.Server

	mu      sync.Mutex
	first   map[string]time.Time // message ID -> first arrival
	total   int                  // arrivals, repeats included
	order   []time.Time          // first arrivals in arrival order
	want    int                  // distinct messages that close done
	done    chan struct{}
	waiting bool

	// refuse, when set before the run, answers the arrival of that number
	// (1-based, repeats included) 429 with Retry-After: retryAfter seconds,
	// as a provider over its quota does; refused is when it did.
	refuse     int
	retryAfter int
	refused    time.Time
}

func newWebhook(tb testing.TB) *webhook {
	tb.Helper()
	w := &webhook{first: map[string]time.Time{}}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	tb.Cleanup(w.srv.Close)
	return w
}

// URL is where providers POST.
func (w *webhook) URL() string { return w.srv.URL + "/send" }

func (w *webhook) serve(rw http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id := r.Header.Get("Idempotency-Key")
	now := time.Now()
	w.mu.Lock()
	w.total++
	if w.total == w.refuse {
		w.refused = now
		w.mu.Unlock()
		rw.Header().Set("Retry-After", strconv.Itoa(w.retryAfter))
		rw.WriteHeader(http.StatusTooManyRequests)
		return
	}
	if _, seen := w.first[id]; !seen {
		w.first[id] = now
		w.order = append(w.order, now)
		if w.waiting && len(w.order) == w.want {
			w.waiting = false
			close(w.done)
		}
	}
	w.mu.Unlock()
	rw.WriteHeader(http.StatusOK)
}

// expect forgets what arrived so far and returns a channel closed once n
// distinct messages have arrived.
func (w *webhook) expect(n int) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.first, w.total, w.order = map[string]time.Time{}, 0, nil
	w.want, w.done, w.waiting = n, make(chan struct{}), true
	return w.done
}

// arrivals returns the distinct messages received, all arrivals (repeats
// included) and the first-arrival times in order.
func (w *webhook) arrivals() (distinct, total int, times []time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	times = append([]time.Time(nil), w.order...)
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	return len(w.first), w.total, times
}

// firstArrivals returns when each message first arrived, by ID.
func (w *webhook) firstArrivals() map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.first)
}

// has reports whether the message with this ID arrived.
func (w *webhook) has(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.first[id]
	return ok
}

// enqueueJobs enqueues n notification jobs on the default queue, each to a
// recipient of its own (prefix + number), from 16 goroutines, and returns
// their task IDs.
func enqueueJobs(ctx context.Context, client *asynq.Client, n int, prefix string) ([]string, error) {
	return enqueueTenantJobs(ctx, client, n, prefix, nil)
}

// enqueueTenantJobs is enqueueJobs with job i of tenant(i) (nil: the default
// tenant).
func enqueueTenantJobs(ctx context.Context, client *asynq.Client, n int, prefix string, tenant func(i int) string) ([]string, error) {
	ids := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				nt := message.Notification{
					Recipient: fmt.Sprintf("%s%06d@example.com", prefix, i),
					Policy:    benchPolicy, Provider: benchProvider, Template: benchTemplate,
					Data: []byte(fmt.Sprintf(`{"n":%d}`, i)),
				}
				if tenant != nil {
					nt.Tenant = tenant(i)
				}
				ids[i] = message.TaskID("")
				task, err := message.NewTask(nt, ids[i], asynq.Queue(benchQueue))
				if err == nil {
					_, err = client.EnqueueContext(ctx, task)
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("enqueue job %d: %w", i, err) })
					return
				}
			}
		})
	}
	wg.Wait()
	return ids, firstErr
}

// awaitEmpty polls the queue until nothing is pending or active, and fails
// when a task sits in retry, scheduled or archived: in these benchmarks
// every job is admitted and every send succeeds, so a task there is a job
// deferred, failed or lost to the run. It returns the time it saw the queue
// empty.
func awaitEmpty(insp *asynq.Inspector, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		q, err := insp.GetQueueInfo(benchQueue)
		if err == nil {
			if q.Retry+q.Scheduled+q.Archived > 0 {
				return time.Time{}, fmt.Errorf("queue %s: %d in retry, %d scheduled, %d archived, want none: %s",
					benchQueue, q.Retry, q.Scheduled, q.Archived, lastErrors(insp))
			}
			if q.Pending+q.Active == 0 {
				return time.Now(), nil
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("queue %s not empty after %s: %+v (%v)", benchQueue, timeout, q, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// lastErrors describes one task in retry and one archived, for a failure message.
func lastErrors(insp *asynq.Inspector) string {
	var out []string
	if ts, err := insp.ListRetryTasks(benchQueue, asynq.PageSize(1)); err == nil && len(ts) > 0 {
		out = append(out, fmt.Sprintf("in retry: %s: %s", ts[0].ID, ts[0].LastErr))
	}
	if ts, err := insp.ListArchivedTasks(benchQueue, asynq.PageSize(1)); err == nil && len(ts) > 0 {
		out = append(out, fmt.Sprintf("archived: %s: %s", ts[0].ID, ts[0].LastErr))
	}
	if len(out) == 0 {
		return "no task details"
	}
	return fmt.Sprint(out)
}

// productModule opens the go.mod of the module the benchmarks build.
const productModule = "module github.com/notify-throttle/throttler\n"

// repoRoot returns the directory holding the product's go.mod, walking up
// from here past the tools module's.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(mod), productModule) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of " + strings.TrimSpace(productModule) + " above the working directory")
		}
		dir = parent
	}
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
