package pipeline

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

var (
	callbacksTasks  = flag.Int("callbacks.tasks", 1000, "jobs per drain in BenchmarkCallbacks")
	callbacksRounds = flag.Int("callbacks.rounds", 3, "rounds of BenchmarkCallbacks, each draining every variant twice (ABBA), and pacing it twice")
	callbacksPaced  = flag.Int("callbacks.paced", 300, "jobs per paced run of BenchmarkCallbacks, enqueued at -callbacks.rate")
	callbacksRate   = flag.Int("callbacks.rate", 300, "jobs per second of BenchmarkCallbacks's paced runs: well under what the pipeline drains")
)

// callbacksSecret signs the benchmark's callbacks.
const callbacksSecret = "bench-callback-secret-0123456789"

// BenchmarkCallbacks measures what a message's events and its tenant's
// status callbacks cost: the throttled pipeline of BenchmarkThroughputVsPlain
// (sent markers, the hand-over of dead workers' tasks, concurrency 64, a
// local webhook), every job admitted at once and sent, in four variants on
// one redis-server:
//
//   - off: no events (jobs.Throttle.Events nil);
//   - history: each outcome recorded in its message's history, no callbacks;
//   - callbacks: the history, and the tenant's callback: a Dispatcher POSTs
//     each event to a local receiver, which verifies its signature;
//   - callbacks_down: the same, to an endpoint that takes each POST and
//     never answers (its events wait in the stream).
//
// Each round drains -callbacks.tasks pre-enqueued jobs through each
// variant twice, in ABBA order (the pipeline saturated: what it costs),
// and runs each twice while -callbacks.paced jobs are enqueued at
// -callbacks.rate a second (the pipeline loaded but not saturated: what a
// message waits). A job is one message with one event here (sent); one
// accepted through the API or enqueue has one more (accepted), one that
// waits one more (booked or deferred). Reported:
//
//   - <variant>_cmds/msg: Redis commands per message over the drains (INFO
//     commandstats, inside scripts included), for callbacks on until the
//     receiver had every event: the Dispatcher's reads, acknowledgements
//     and key lookups included;
//   - <variant>_tasks/s: the drains' throughput;
//   - <variant>_send_p50_µs, _send_p99_µs: the send path of the paced
//     runs, from the handler's start to the provider's call, which no
//     event is recorded on (target: off's, within noise);
//   - <variant>_handler_µs: the paced handler's whole run, the recording
//     of the sent event after the provider's answer included.
func BenchmarkCallbacks(b *testing.B) {
	srv := redistest.Start(b)
	admin := srv.Client(b)
	ctx := context.Background()
	hook := newWebhook(b)
	enq := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16})
	b.Cleanup(func() { _ = enq.Close() })
	client := asynq.NewClientFromRedisClient(enq)
	insp := asynq.NewInspectorFromRedisClient(enq)
	live := newCallbackSink(b, false)
	dead := newCallbackSink(b, true)

	vs := []*eventsVariant{
		newEventsVariant(b, srv.Addr, hook.URL(), "off", nil),
		newEventsVariant(b, srv.Addr, hook.URL(), "history", map[string]lifecycle.Endpoint{}),
		newEventsVariant(b, srv.Addr, hook.URL(), "callbacks", map[string]lifecycle.Endpoint{"": {URL: live.srv.URL, Secret: callbacksSecret}}),
		newEventsVariant(b, srv.Addr, hook.URL(), "callbacks_down", map[string]lifecycle.Endpoint{"": {URL: dead.srv.URL, Secret: callbacksSecret, Timeout: time.Hour}}),
	}
	drains := 0
	drain := func(v *eventsVariant, n int) {
		b.Helper()
		drains++
		if _, err := enqueueJobs(ctx, client, n, fmt.Sprintf("%s-%d-", v.name, drains)); err != nil {
			b.Fatal(err)
		}
		d, cost, err := v.drain(ctx, admin, insp, hook, n)
		if err != nil {
			b.Fatalf("%s, drain %d: %v", v.name, drains, err)
		}
		if v.name == "callbacks" { // and on until every event was delivered
			mid, err := readCost(ctx, admin)
			if err == nil {
				err = awaitStreamEmpty(ctx, admin, 30*time.Second)
			}
			if err != nil {
				b.Fatalf("%s, drain %d: %v", v.name, drains, err)
			}
			end, err := readCost(ctx, admin)
			if err != nil {
				b.Fatal(err)
			}
			cost = cost.plus(end.minus(mid))
		}
		v.total.tasks += n
		v.total.elapsed += d
		v.total.cost = v.total.cost.plus(cost)
	}
	for _, v := range vs {
		drain(v, e2eWarmup)
		v.total = e2eTotal{}
	}
	paced := 0
	pace := func(v *eventsVariant) {
		b.Helper()
		paced++
		if err := v.paced(ctx, client, insp, hook, *callbacksPaced, *callbacksRate, fmt.Sprintf("%s-p%d-", v.name, paced)); err != nil {
			b.Fatalf("%s, paced run %d: %v", v.name, paced, err)
		}
	}
	for range *callbacksRounds {
		back := slices.Clone(vs)
		slices.Reverse(back)
		for _, v := range append(slices.Clone(vs), back...) {
			drain(v, *callbacksTasks)
		}
		for _, v := range append(slices.Clone(vs), back...) {
			pace(v)
		}
	}
	if bad := live.badSignatures(); bad > 0 {
		b.Fatalf("%d callbacks whose signature did not verify", bad)
	}
	off := vs[0]
	for _, v := range vs {
		t := v.total
		cmds := t.cost.calls / float64(t.tasks)
		p50, p99 := nearestRank(v.sendPath.values(), 0.5), nearestRank(v.sendPath.values(), 0.99)
		handler := nearestRank(v.handlerTime.values(), 0.5)
		b.Logf("%s: drained %.0f tasks/s, %.1f Redis commands a message (%+.1f over off), Redis CPU %.0fµs; paced: send path p50 %.0fµs p99 %.0fµs, handler p50 %.0fµs",
			v.name, t.rate(), cmds, cmds-off.total.cost.calls/float64(off.total.tasks), 1e6*t.cost.redisCPU/float64(t.tasks), p50, p99, handler)
		b.ReportMetric(cmds, v.name+"_cmds/msg")
		b.ReportMetric(t.rate(), v.name+"_tasks/s")
		b.ReportMetric(p50, v.name+"_send_p50_µs")
		b.ReportMetric(p99, v.name+"_send_p99_µs")
		b.ReportMetric(handler, v.name+"_handler_µs")
	}
	b.Logf("callbacks delivered %d (every signature verified); callbacks_down holds %d in its stream", live.count(), admin.XLen(ctx, "callbacks_down:callbacks:{}").Val())
}

// eventsVariant is the throttled pipeline with events recorded as its
// name says, and its totals.
type eventsVariant struct {
	*e2eVariant
	timing      atomic.Bool // the paced runs: sendPath and handlerTime are taken
	sendPath    *durations  // paced: handler start to provider call, per job
	handlerTime *durations  // paced: the handler's run, per job
	total       e2eTotal    // the drains'
}

// newEventsVariant is newThrottled's pipeline (sent markers, recovery)
// with, unless callbacks is nil, a Recorder of events whose tenants with a
// callback are callbacks' keys, and a Dispatcher of those running until
// the benchmark ends. Each variant's events have a key prefix of their
// own ("<name>:"), so that one's stream is not another's.
func newEventsVariant(b *testing.B, addr, url, name string, callbacks map[string]lifecycle.Endpoint) *eventsVariant {
	b.Helper()
	rdb := newWorkerClient(b, addr)
	lim, quota, bucket := benchRules(b, rdb)
	v := &eventsVariant{e2eVariant: &e2eVariant{name: name, rdb: rdb}, sendPath: &durations{}, handlerTime: &durations{}}
	provider := providers.NewWebhook(benchProvider, url, 5*time.Second, nil, nil)
	timed := providers.Func(func(ctx context.Context, m providers.Message) (string, error) {
		if start, ok := ctx.Value(handlerStart{}).(time.Time); ok {
			v.sendPath.add(time.Since(start))
		}
		return provider.Send(ctx, m)
	})
	th := &jobs.Throttle{
		Limiter: lim,
		Rules:   jobs.Rules{Policies: map[string]*throttle.Quota{benchPolicy: quota}, Providers: map[string]jobs.Route{benchProvider: {Bucket: bucket, Provider: timed}}},
		Sent:    jobs.NewSentMarks(lim),
		Metrics: jobs.NewMetrics(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pacing:  jobs.Pacing{InlineWait: time.Second},
	}
	if callbacks != nil {
		o := lifecycle.Options{Prefix: name + ":", Callbacks: callbacks, Log: th.Log}
		th.Events = lifecycle.NewRecorder(rdb, o)
		if len(callbacks) > 0 {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); lifecycle.NewDispatcher(rdb, o).Run(ctx) }()
			b.Cleanup(func() { cancel(); <-done })
		}
	}
	rec := newRecovery(b, rdb)
	th.Fleet = rec
	mux := asynq.NewServeMux()
	mux.Use(v.watch, v.stampStart, rec.Middleware)
	mux.Handle(message.TaskType, th)
	v.handler = mux
	return v
}

// handlerStart is the context key of the time a job's handler started.
type handlerStart struct{}

// stampStart is a middleware that, in the paced runs, notes in the
// context when the handler started, for the send path's timing, and times
// the handler.
func (v *eventsVariant) stampStart(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if !v.timing.Load() {
			return next.ProcessTask(ctx, t)
		}
		start := time.Now()
		err := next.ProcessTask(context.WithValue(ctx, handlerStart{}, start), t)
		v.handlerTime.add(time.Since(start))
		return err
	})
}

// paced runs a fresh asynq server of v while n jobs are enqueued one by
// one, rate a second, until the webhook has them all and the queue is
// empty; the send path and the handler are timed meanwhile.
func (v *eventsVariant) paced(ctx context.Context, client *asynq.Client, insp *asynq.Inspector, hook *webhook, n, rate int, prefix string) error {
	v.failed = &firstError{}
	v.timing.Store(true)
	defer v.timing.Store(false)
	done := hook.expect(n)
	srv := asynq.NewServerFromRedisClient(v.rdb, asynq.Config{Concurrency: e2eConcurrency, Queues: map[string]int{benchQueue: 1},
		IsFailure: jobs.IsFailure, RetryDelayFunc: jobs.RetryDelay(0), DelayedTaskCheckInterval: time.Second,
		TaskCheckInterval: 20 * time.Millisecond, LogLevel: asynq.ErrorLevel})
	if err := srv.Start(v.handler); err != nil {
		return err
	}
	defer srv.Shutdown()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		nt := message.Notification{Recipient: fmt.Sprintf("%s%06d@example.com", prefix, i), Policy: benchPolicy, Provider: benchProvider, Template: benchTemplate}
		task, err := message.NewTask(nt, message.TaskID(""), asynq.Queue(benchQueue))
		if err == nil {
			_, err = client.EnqueueContext(ctx, task)
		}
		if err != nil {
			return err
		}
	}
	select {
	case <-done:
	case <-time.After(e2eTimeout):
		return fmt.Errorf("not every job delivered after %s", e2eTimeout)
	}
	if _, err := awaitEmpty(insp, 10*time.Second); err != nil {
		return err
	}
	return v.failed.get()
}

// durations collects durations from many goroutines.
type durations struct {
	mu sync.Mutex
	us []float64
}

func (d *durations) add(x time.Duration) {
	d.mu.Lock()
	d.us = append(d.us, float64(x)/float64(time.Microsecond))
	d.mu.Unlock()
}

func (d *durations) values() []float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.us)
}

// nearestRank returns the q quantile of xs, by nearest rank.
func nearestRank(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// callbackSink is a tenant's callback endpoint: it verifies and counts
// every POST, or, dead, takes each and never answers.
type callbackSink struct {
	srv  *httptest.Server
	hung chan struct{}

	mu       sync.Mutex
	verified int
	bad      int
}

func newCallbackSink(b *testing.B, dead bool) *callbackSink {
	s := &callbackSink{hung: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dead {
			select {
			case <-s.hung:
			case <-r.Context().Done():
			}
			return
		}
		body, _ := io.ReadAll(r.Body)
		err := lifecycle.Verify(callbacksSecret, r.Header.Get(lifecycle.SignatureHeader), body, time.Minute)
		s.mu.Lock()
		if err != nil {
			s.bad++
		} else {
			s.verified++
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(func() { close(s.hung); s.srv.Close() })
	return s
}

func (s *callbackSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.verified
}

func (s *callbackSink) badSignatures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bad
}

// liveStream is the stream of the callbacks variant: its default tenant's.
const liveStream = "callbacks:callbacks:{}"

// awaitStreamEmpty polls the callbacks variant's stream until every event
// in it was delivered.
func awaitStreamEmpty(ctx context.Context, admin *redis.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for admin.XLen(ctx, liveStream).Val() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d events still undelivered after %s", admin.XLen(ctx, liveStream).Val(), timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
