package pipeline

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/fleet"
	"github.com/notify-throttle/throttler/internal/cpustat"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

var (
	e2eTasks   = flag.Int("e2e.tasks", 1000, "jobs per drain in BenchmarkThroughputVsPlain")
	e2eRounds  = flag.Int("e2e.rounds", 6, "rounds of BenchmarkThroughputVsPlain, each draining every variant twice (ABBA)")
	e2eFloor   = flag.Bool("e2e.floor", false, "also run plain+script and plain+admit in BenchmarkThroughputVsPlain: plain plus one trivial script call, or one bare admission, per job")
	e2eServers = flag.Int("e2e.servers", 1, "asynq servers per variant in BenchmarkThroughputVsPlain, sharing its concurrency of 64 (1: as cmd/worker)")
	e2ePool    = flag.Int("e2e.pool", 0, "go-redis PoolSize of each variant's client in BenchmarkThroughputVsPlain (0: go-redis's default, as cmd/worker)")
	e2eBook    = flag.Bool("e2e.book", false, "also run \"booking\" in BenchmarkThroughputVsPlain: the throttled pipeline with worker.book and book_ahead 5s, as config.yaml sets them")
)

const (
	e2eConcurrency = 64 // asynq Config.Concurrency of both servers
	e2eWarmup      = 500
	e2eTimeout     = 2 * time.Minute // one drain; far beyond any sane run
	e2eTarget      = 0.85
)

// e2eVariant is one contender: an asynq handler on a Redis client of its own
// (default options, as cmd/worker connects), run by a fresh asynq server per
// round.
type e2eVariant struct {
	name    string
	rdb     *redis.Client
	handler asynq.Handler
	failed  *firstError
	busy    atomic.Int64 // ns spent in the handler, summed over jobs
}

// firstError keeps the first error a handler returned in a round.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// e2eTotal is what a variant did over all its rounds.
type e2eTotal struct {
	tasks   int
	elapsed time.Duration
	cost    e2eCost
}

func (t e2eTotal) rate() float64 { return float64(t.tasks) / t.elapsed.Seconds() }

// cpu is the CPU one task cost: Redis's and this process's.
func (t e2eTotal) cpu() float64 { return (t.cost.redisCPU + t.cost.clientCPU) / float64(t.tasks) }

// BenchmarkThroughputVsPlain measures end-to-end throughput of the worker
// with the throttle against a plain asynq server, in one run, on one
// redis-server, both at concurrency 64 and delivering to the same local
// webhook:
//
//   - throttled: jobs.Throttle as the handler, through a
//     providers.NewWebhook, policy 1/24h + 3/168h, bucket 10⁶/s burst 10⁶;
//     every job has a recipient of its own, so every job is admitted (a job
//     deferred would fail the benchmark); with sent markers, as cmd/worker
//     runs by default: the admission checks the marker, and a sent job's
//     marker is written before its handler returns (one more round trip);
//     and with the hand-over of dead workers' tasks (recovery.Middleware
//     and Holds), as cmd/worker runs by default;
//   - unmarked: throttled without sent markers (worker.sent_marks: 0);
//   - plain: a handler that decodes the payload as Throttle does and POSTs
//     the same message through its own providers.NewWebhook;
//   - plain+script, with -e2e.floor: plain plus one trivial script call per
//     job, the floor of any admission that costs one round trip;
//   - plain+admit, with -e2e.floor: plain plus one bare admission per job
//     (throttle.Limiter.Admit with MaxWait, of the throttled variant's recipient quota
//     and provider bucket, without the rest of the handler and without a
//     marker): what the admission's script costs, apart from everything
//     else the handler does.
//
// A drain pre-enqueues -e2e.tasks jobs, starts a fresh asynq server and
// times from its start until the webhook has every message and the queue is
// empty. Each of -e2e.rounds rounds drains every variant twice in ABBA order,
// so that load rising or falling during the round hits all alike. Reported:
//
//   - throttled_tasks/s, plain_tasks/s: all tasks over all drain time;
//   - throttled/plain: the ratio of those (target >= 0.85);
//   - unmarked/plain: the same without sent markers;
//   - median_ratio: the median of the rounds' ratios: the robust one when
//     other processes come and go on the machine;
//   - cpu_ratio: plain's CPU per task over throttled's (Redis's + this
//     process's), the throughput ratio to expect where CPU is what runs
//     out, whatever share of it other processes leave;
//   - throttled_cmds/task, plain_cmds/task: Redis commands per task (INFO
//     commandstats, commands inside scripts included);
//   - ns/op, B/op and allocs/op: the throttled variant's per task, for the
//     whole process (asynq, the HTTP client and the webhook server).
//
// The log adds, per variant, the time a job spends in its handler and how
// many of the 64 slots that keeps busy on average (Little's law): about 2,
// since asynq's processor dequeues one task per Redis round trip in one
// goroutine, so that loop, not the handlers, sets the pace; and per task the
// Redis CPU, this process's CPU, Redis commands and script calls.
func BenchmarkThroughputVsPlain(b *testing.B) {
	srv := redistest.Start(b)
	admin := srv.Client(b)
	ctx := context.Background()
	hook := newWebhook(b)
	enq := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16})
	b.Cleanup(func() { _ = enq.Close() })
	client := asynq.NewClientFromRedisClient(enq)
	insp := asynq.NewInspectorFromRedisClient(enq)

	th, pl := newThrottled(b, srv.Addr, hook.URL(), true, false), newPlain(b, srv.Addr, hook.URL(), plainOnly)
	nm := newThrottled(b, srv.Addr, hook.URL(), false, false)
	vs := []*e2eVariant{th, pl, nm}
	if *e2eBook {
		vs = append(vs, newThrottled(b, srv.Addr, hook.URL(), true, true))
	}
	var floor, bare *e2eVariant
	if *e2eFloor {
		floor, bare = newPlain(b, srv.Addr, hook.URL(), plainScript), newPlain(b, srv.Addr, hook.URL(), plainAdmit)
		vs = append(vs, floor, bare)
	}
	drains := 0
	drain := func(v *e2eVariant, n int) (time.Duration, e2eCost) {
		b.Helper()
		drains++
		ids, err := enqueueJobs(ctx, client, n, fmt.Sprintf("%s-%d-", v.name, drains))
		if err != nil {
			b.Fatal(err)
		}
		d, cost, err := v.drain(ctx, admin, insp, hook, n)
		if err != nil {
			b.Fatalf("%s, drain %d: %v", v.name, drains, err)
		}
		for _, id := range ids {
			if !hook.has(id) {
				b.Fatalf("%s, drain %d: job %s was enqueued and never delivered", v.name, drains, id)
			}
		}
		return d, cost
	}
	for _, v := range vs {
		drain(v, e2eWarmup)
	}

	total := map[*e2eVariant]e2eTotal{}
	ratios := map[*e2eVariant][]float64{} // per round, against plain
	for range *e2eRounds {
		// ABBA: each variant drains twice, symmetric in time, so that load
		// that rises or falls during the round hits all of them alike.
		back := slices.Clone(vs)
		slices.Reverse(back)
		order := append(slices.Clone(vs), back...)
		round := map[*e2eVariant]e2eTotal{}
		for _, v := range order {
			d, cost := drain(v, *e2eTasks)
			t := round[v]
			t.tasks += *e2eTasks
			t.elapsed += d
			t.cost = t.cost.plus(cost)
			round[v] = t
		}
		for _, v := range vs {
			t := total[v]
			t.tasks += round[v].tasks
			t.elapsed += round[v].elapsed
			t.cost = t.cost.plus(round[v].cost)
			total[v] = t
			ratios[v] = append(ratios[v], round[v].rate()/round[pl].rate())
		}
	}
	// At most 9 lines: the testing package cuts a benchmark's log at 10.
	var byRound []string
	for _, v := range vs {
		if v != pl {
			byRound = append(byRound, v.name+" "+formatRatios(ratios[v]))
		}
	}
	b.Logf("against plain by round: %s", strings.Join(byRound, "; "))
	for _, v := range vs {
		t := total[v]
		b.Logf("%s: %.0f tasks/s, %.3f of plain (median of rounds %.3f); %.0fµs in the handler, %.1f of %d slots busy; per task: %s",
			v.name, t.rate(), t.rate()/total[pl].rate(), median(ratios[v]), 1e6*t.cost.busy/float64(t.tasks),
			t.cost.busy/t.elapsed.Seconds(), e2eConcurrency, t.cost.per(t.tasks))
	}
	tt, pt := total[th], total[pl]
	ratio, cpuRatio := tt.rate()/pt.rate(), pt.cpu()/tt.cpu()
	b.Logf("throttled/plain %.3f, median of rounds %.3f, by CPU per task %.3f; target >= %.2f (by both of the first two): %s",
		ratio, median(ratios[th]), cpuRatio, e2eTarget, verdict(min(ratio, median(ratios[th])) >= e2eTarget))
	b.ReportMetric(tt.rate(), "throttled_tasks/s")
	b.ReportMetric(pt.rate(), "plain_tasks/s")
	b.ReportMetric(ratio, "throttled/plain")
	b.ReportMetric(median(ratios[th]), "median_ratio")
	b.ReportMetric(cpuRatio, "cpu_ratio")
	b.ReportMetric(total[nm].rate()/pt.rate(), "unmarked/plain")
	b.ReportMetric(tt.cost.calls/float64(tt.tasks), "throttled_cmds/task")
	b.ReportMetric(pt.cost.calls/float64(pt.tasks), "plain_cmds/task")
	if floor != nil {
		b.ReportMetric(total[floor].rate()/pt.rate(), "plain+script/plain")
		b.ReportMetric(total[bare].rate()/pt.rate(), "plain+admit/plain")
	}
	b.ReportMetric(1e9/tt.rate(), "ns/op")
	b.ReportMetric(float64(tt.cost.allocBytes)/float64(tt.tasks), "B/op")
	b.ReportMetric(float64(tt.cost.allocs)/float64(tt.tasks), "allocs/op")
}

func formatRatios(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(s, " ")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// newThrottled is the worker's pipeline as cmd/worker builds it, with sent
// markers (cmd/worker's default) or without (worker.sent_marks: 0), and
// with booking (config.yaml's worker.book and book_ahead) or without (the
// default where a file does not say).
func newThrottled(b *testing.B, addr, url string, marks, book bool) *e2eVariant {
	b.Helper()
	rdb := newWorkerClient(b, addr)
	lim, quota, bucket := benchRules(b, rdb)
	th := &jobs.Throttle{
		Limiter: lim,
		Rules:   jobs.Rules{Policies: map[string]*throttle.Quota{benchPolicy: quota}, Providers: map[string]jobs.Route{benchProvider: {Bucket: bucket, Provider: providers.NewWebhook(benchProvider, url, 5*time.Second, nil, nil)}}},
		Metrics: jobs.NewMetrics(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pacing:  jobs.Pacing{InlineWait: time.Second},
	}
	v := &e2eVariant{name: "throttled", rdb: rdb}
	if book {
		th.Book, th.BookAhead, v.name = true, 5*time.Second, "booking"
	}
	if marks {
		th.Sent = jobs.NewSentMarks(lim)
	} else {
		v.name = "unmarked"
	}
	rec := newRecovery(b, rdb)
	th.Fleet = rec
	mux := asynq.NewServeMux()
	mux.Use(v.watch, rec.Middleware)
	mux.Handle(message.TaskType, th)
	v.handler = mux
	return v
}

// newRecovery is the hand-over of dead workers' tasks as cmd/worker runs it
// by default (worker.dead_after 5s), on rdb, for the benchmark's queue, with
// its signs of life and reaps running until the benchmark ends.
func newRecovery(b *testing.B, rdb *redis.Client) *fleet.Member {
	b.Helper()
	rec := fleet.New(rdb, []string{benchQueue}, fleet.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rec.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return rec
}

// benchRules are the throttled variant's: a limiter on rdb, the policy
// 1/24h + 3/168h and the bucket 10⁶/s burst 10⁶.
func benchRules(b *testing.B, rdb *redis.Client) (*throttle.Limiter, *throttle.Quota, *throttle.Bucket) {
	b.Helper()
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		b.Fatal(err)
	}
	quota, err := throttle.NewQuota(benchPolicy,
		throttle.Window{Limit: 1, Per: 24 * time.Hour}, throttle.Window{Limit: 3, Per: 168 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	bucket, err := throttle.NewBucket(benchProvider, 1e6, 1e6)
	if err != nil {
		b.Fatal(err)
	}
	return lim, quota, bucket
}

// plainKind is what a plain variant does besides decoding and sending.
type plainKind int

const (
	plainOnly   plainKind = iota // nothing
	plainScript                  // one trivial script call
	plainAdmit                   // one bare admission
)

// newPlain is the same job without the throttle: decode, then the same
// POST. With plainScript, each job first runs a trivial script (Redis TIME
// and ZCARD of a key named like the recipient's quota, as throttle's
// benchmarks do): the floor of any admission that costs one script call per
// job. With plainAdmit, each job is first admitted by Limiter.Admit with MaxWait
// through the throttled variant's rules, as the handler's admission of it
// would be, but with nothing else of the handler: no marker, no metrics,
// no logs; a job not allowed at once fails the drain.
func newPlain(b *testing.B, addr, url string, kind plainKind) *e2eVariant {
	b.Helper()
	provider := providers.NewWebhook(benchProvider, url, 5*time.Second, nil, nil)
	v := &e2eVariant{name: "plain", rdb: newWorkerClient(b, addr)}
	var admit func(ctx context.Context, id, recipient string) error
	switch kind {
	case plainScript:
		v.name = "plain+script"
		trivial := redis.NewScript(e2eTrivialSrc)
		admit = func(ctx context.Context, _, recipient string) error {
			return trivial.Run(ctx, v.rdb, []string{"throttle:{" + recipient + "}:q:" + benchPolicy}).Err()
		}
	case plainAdmit:
		v.name = "plain+admit"
		lim, quota, bucket := benchRules(b, v.rdb)
		admit = func(ctx context.Context, id, recipient string) error {
			d, err := lim.Admit(ctx, throttle.Request{ID: id, Takes: []throttle.Take{
				{Rule: quota, Subject: recipient}, {Rule: bucket, Subject: benchProvider}}, MaxWait: time.Second})
			if err == nil && (!d.Allowed() || d.Delay > 0) {
				err = fmt.Errorf("task %s not admitted at once: %+v", id, d)
			}
			return err
		}
	}
	mux := asynq.NewServeMux()
	mux.Use(v.watch)
	mux.HandleFunc(message.TaskType, func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, err := message.Decode(t.Payload())
		if err != nil {
			return fmt.Errorf("malformed notification: %v: %w", err, asynq.SkipRetry)
		}
		if admit != nil {
			if err := admit(ctx, id, n.Recipient); err != nil {
				return err
			}
		}
		_, err = provider.Send(ctx, providers.Message{ID: id, Recipient: n.Recipient, Template: n.Template, Data: n.Data})
		return err
	})
	v.handler = mux
	return v
}

// e2eTrivialSrc is the least a one-call Lua admission does: the script
// call itself, Redis TIME and one read of the recipient's key.
const e2eTrivialSrc = `redis.call('TIME')
return redis.call('ZCARD', KEYS[1])`

// newWorkerClient connects as cmd/worker does: redis.ParseURL's defaults.
func newWorkerClient(b *testing.B, addr string) *redis.Client {
	b.Helper()
	opts, err := redis.ParseURL("redis://" + addr + "/0")
	if err != nil {
		b.Fatal(err)
	}
	if *e2ePool > 0 {
		opts.PoolSize = *e2ePool
	}
	rdb := redis.NewClient(opts)
	b.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// watch sums the time jobs spend in the handler and remembers the first
// error one returned: every job must succeed.
func (v *e2eVariant) watch(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		start := time.Now()
		err := next.ProcessTask(ctx, t)
		v.busy.Add(int64(time.Since(start)))
		if err != nil {
			v.failed.set(err)
		}
		return err
	})
}

// drain runs a fresh asynq server until the n pre-enqueued jobs have reached
// the webhook and left the queue, and returns the time from start to empty
// and what it cost.
func (v *e2eVariant) drain(ctx context.Context, admin *redis.Client, insp *asynq.Inspector, hook *webhook, n int) (time.Duration, e2eCost, error) {
	q0, err := insp.GetQueueInfo(benchQueue)
	if err != nil {
		return 0, e2eCost{}, err
	}
	if q0.Pending != n || q0.Size != n {
		return 0, e2eCost{}, fmt.Errorf("queue holds %d pending of %d, want %d", q0.Pending, q0.Size, n)
	}
	v.failed = &firstError{}
	v.busy.Store(0)
	done := hook.expect(n)
	cfg := asynq.Config{
		Concurrency:              e2eConcurrency / *e2eServers,
		Queues:                   map[string]int{benchQueue: 1},
		IsFailure:                jobs.IsFailure,
		RetryDelayFunc:           jobs.RetryDelay(0),
		DelayedTaskCheckInterval: time.Second,
		// Polling an empty queue every 20 ms rather than 1 s only makes
		// Shutdown quick after a drain: the queue is never empty during one.
		TaskCheckInterval: 20 * time.Millisecond,
		LogLevel:          asynq.ErrorLevel,
	}
	c0, err := readCost(ctx, admin)
	if err != nil {
		return 0, e2eCost{}, err
	}
	start := time.Now()
	for range *e2eServers {
		srv := asynq.NewServerFromRedisClient(v.rdb, cfg)
		if err := srv.Start(v.handler); err != nil {
			return 0, e2eCost{}, err
		}
		defer srv.Shutdown()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(e2eTimeout)
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			if err := v.failed.get(); err != nil {
				return 0, e2eCost{}, fmt.Errorf("a job failed (every job must be admitted and sent): %w", err)
			}
		case <-timeout:
			distinct, _, _ := hook.arrivals()
			return 0, e2eCost{}, fmt.Errorf("%d of %d jobs delivered after %s", distinct, n, e2eTimeout)
		}
	}
	end, err := awaitEmpty(insp, 10*time.Second)
	if err != nil {
		return 0, e2eCost{}, err
	}
	elapsed := end.Sub(start)
	c1, err := readCost(ctx, admin)
	if err != nil {
		return 0, e2eCost{}, err
	}
	if err := v.failed.get(); err != nil {
		return 0, e2eCost{}, fmt.Errorf("a job failed (every job must be admitted and sent): %w", err)
	}
	q1, err := insp.GetQueueInfo(benchQueue)
	if err != nil {
		return 0, e2eCost{}, err
	}
	if got := q1.ProcessedTotal - q0.ProcessedTotal; got != n || q1.FailedTotal != q0.FailedTotal {
		return 0, e2eCost{}, fmt.Errorf("asynq processed %d and failed %d, want %d and 0", got, q1.FailedTotal-q0.FailedTotal, n)
	}
	if distinct, total, _ := hook.arrivals(); distinct != n || total != n {
		return 0, e2eCost{}, fmt.Errorf("the webhook got %d messages (%d distinct), want %d once each", total, distinct, n)
	}
	cost := c1.minus(c0)
	cost.busy = time.Duration(v.busy.Load()).Seconds()
	return elapsed, cost, nil
}

// e2eCost is what the server and this process have spent so far.
type e2eCost struct {
	redisCPU, clientCPU float64 // seconds, user + sys
	calls, scripts      float64 // Redis commands; EVAL, EVALSHA, FCALL and FCALL_RO among them
	scriptUsec          float64 // µs Redis spent in those scripts
	allocs, allocBytes  uint64  // this process's
	busy                float64 // seconds jobs spent in the handler, summed
}

func (c e2eCost) minus(d e2eCost) e2eCost {
	return e2eCost{c.redisCPU - d.redisCPU, c.clientCPU - d.clientCPU, c.calls - d.calls, c.scripts - d.scripts,
		c.scriptUsec - d.scriptUsec, c.allocs - d.allocs, c.allocBytes - d.allocBytes, c.busy - d.busy}
}

func (c e2eCost) plus(d e2eCost) e2eCost {
	return e2eCost{c.redisCPU + d.redisCPU, c.clientCPU + d.clientCPU, c.calls + d.calls, c.scripts + d.scripts,
		c.scriptUsec + d.scriptUsec, c.allocs + d.allocs, c.allocBytes + d.allocBytes, c.busy + d.busy}
}

func (c e2eCost) per(n int) string {
	f := float64(n)
	return fmt.Sprintf("Redis CPU %.0fµs, test process CPU %.0fµs, %.1f Redis commands (%.1f scripts, %.0fµs in them), %.0f allocs, %.0f B",
		1e6*c.redisCPU/f, 1e6*c.clientCPU/f, c.calls/f, c.scripts/f, c.scriptUsec/f, float64(c.allocs)/f, float64(c.allocBytes)/f)
}

// readCost reads INFO commandstats and cpu, this process's CPU time
// (/proc/self/stat) and its allocations.
func readCost(ctx context.Context, admin *redis.Client) (e2eCost, error) {
	var c e2eCost
	info, err := admin.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return c, err
	}
	for _, line := range strings.Split(info, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_user", "used_cpu_sys":
			x, _ := strconv.ParseFloat(val, 64)
			c.redisCPU += x
			continue
		}
		cmd, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		calls, usec := statField(val, "calls"), statField(val, "usec")
		c.calls += calls
		switch cmd {
		case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
			c.scripts += calls
			c.scriptUsec += usec
		}
	}
	c.clientCPU = cpustat.Self()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	c.allocs, c.allocBytes = m.Mallocs, m.TotalAlloc
	return c, nil
}

// statField returns the value of name in "calls=3,usec=12,...".
func statField(val, name string) float64 {
	for _, f := range strings.Split(val, ",") {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			x, _ := strconv.ParseFloat(v, 64)
			return x
		}
	}
	return 0
}
