package pipeline

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
)

// The booking benchmarks: built worker binaries with config.yaml's booking
// settings (worker.book, inline_wait 2.5s, priority_queues [critical]) on a
// provider that binds, measured as the issue asks (docs/booking.md).

var (
	backlogSizes  = flag.String("backlog.sizes", "1000,10000,100000", "backlogs of BenchmarkBacklog, comma-separated")
	backlogPeriod = flag.Duration("backlog.period", 30*time.Second, "measuring period of BenchmarkBacklog, after the first pass")
	backlogConc   = flag.String("backlog.concurrency", "20,100", "worker.concurrency of the 2 workers in BenchmarkBacklog, comma-separated")
	burstInline   = flag.String("burst.inline_wait", "0s,1s,2.5s", "worker.inline_wait of BenchmarkRecipientBurst, comma-separated")
	burstMonitor  = flag.String("burst.monitor", "", "file to record every command of BenchmarkRecipientBurst's Redis in (MONITOR, scripts' commands included)")
)

const (
	bookRate        = 20 // the provider that binds, messages/s
	bookBurst       = 5
	bookWorkers     = 2
	bookConcurrency = 20
	bookProvider    = "hook" // benchProvider: ledgerKey etc. below
	// bookSettle follows the first pass before the period starts: jobs booked
	// in the first seconds of it woke while the queue still held the backlog
	// and came back behind it, late; they claim late or book again within
	// inline_wait + a second of the pass's end.
	bookSettle = 5 * time.Second
	// bookWindowMargin is worker.window_margin as bookConfig leaves it:
	// config.DefaultWindowMargin (not imported: the config package would
	// bring the embedded Redis's dependencies into this module). Every
	// window of a policy is held that much longer.
	bookWindowMargin = 250 * time.Millisecond
	// backlogPolicy is generous: each recipient has one message.
	backlogPolicy = "[{limit: 1000, per: 1h}]"
)

// bookConfig is the workers' config: config.yaml's worker settings for
// booking (inline_wait as the fleet says: 2.5s unless a benchmark varies
// it), the test's redis-server, policy marketing (what enqueueJobs names) as
// each benchmark says, one webhook provider. remember_takes keeps
// the bucket's grants for the whole run (default 2s), for the check on the
// granted moments: its ledger's memory is that of 3 minutes of sends.
const bookConfig = `redis:
  url: redis://%s/0
worker:
  concurrency: %d
  queues: {critical: 6, default: 3}
  shutdown_timeout: 10s
  http_addr: %q
  inline_wait: %s
  jitter: 1s
  book: true
  priority_queues: [critical]
  remember_takes: 3m
policies:
  marketing: %s
providers:
  hook: {type: webhook, url: %q, timeout: 5s, rate: %s, burst: %d}
defaults: {policy: marketing, provider: hook, queue: default}
`

// The provider's keys (internal/keyspace): its bucket's state hash, the
// bookings (tickets), the slot calendar (with the ledger of who took each
// slot), the tenants' lines and their expiries.
const (
	bucketStateKey   = "throttle:{" + bookProvider + "}:b:" + bookProvider
	bucketBookKey    = bucketStateKey + ":book"
	bucketSlotsKey   = bucketStateKey + ":slots"
	bucketFairKey    = bucketStateKey + ":fair"
	bucketTenantsKey = bucketStateKey + ":tenants"
)

// bookFleet is a redis-server, the webhook and worker processes.
type bookFleet struct {
	srv    *redistest.Server
	admin  *redis.Client
	insp   *asynq.Inspector
	client *asynq.Client
	hook   *webhook
	bin    string
	ws     []*workerProc
	slots  int // worker.concurrency of each worker

	// inlineWait is worker.inline_wait ("" for config.yaml's 2.5s), set
	// before start.
	inlineWait string
	// What start was given, for a reload's config.
	policy string
	rate   float64
	burst  int
}

func newBookFleet(b *testing.B, bin string) *bookFleet {
	f := &bookFleet{srv: redistest.Start(b), hook: newWebhook(b), bin: bin}
	f.admin = f.srv.Client(b)
	enq := redis.NewClient(&redis.Options{Addr: f.srv.Addr, PoolSize: 16})
	b.Cleanup(func() { _ = enq.Close() })
	f.insp, f.client = asynq.NewInspectorFromRedisClient(enq), asynq.NewClientFromRedisClient(enq)
	return f
}

// start starts the workers with policy and a provider of rate and burst,
// and waits until they are healthy.
func (f *bookFleet) start(b *testing.B, concurrency int, policy string, rate float64, burst int) {
	f.slots, f.policy, f.rate, f.burst = concurrency, policy, rate, burst
	for i := range bookWorkers {
		f.ws = append(f.ws, startWorkerWith(b, f.bin, i, f.config))
	}
	for _, w := range f.ws {
		w.awaitHealthy(b)
	}
}

// config is a worker's config file, with its metrics address, as the fleet
// now stands (start's settings, or a reload's rate and burst).
func (f *bookFleet) config(metrics string) string {
	inline := f.inlineWait
	if inline == "" {
		inline = "2.5s"
	}
	return fmt.Sprintf(bookConfig, f.srv.Addr, f.slots, metrics, inline, f.policy, f.hook.URL(),
		strconv.FormatFloat(f.rate, 'f', -1, 64), f.burst)
}

// stop stops the workers, each cleanly.
func (f *bookFleet) stop(b *testing.B) {
	for _, w := range f.ws {
		if err := w.stop(); err != nil {
			b.Fatalf("worker %d: %v\n%s", w.n, err, w.logTail())
		}
	}
}

// requireEachSent fails the benchmark when a worker delivered nothing: the
// run would not be the 2-process run it claims.
func (f *bookFleet) requireEachSent(b *testing.B) {
	for _, w := range f.ws {
		m, err := w.scrape()
		if err != nil {
			b.Fatalf("worker %d: %v", w.n, err)
		}
		if m["throttler_sent_total"] == 0 {
			b.Fatalf("worker %d delivered nothing: not a %d-process run", w.n, len(f.ws))
		}
	}
}

// bookSnap is what the fleet and its Redis have done up to a moment.
type bookSnap struct {
	at      time.Time
	cost    e2eCost
	fcalls  float64            // FCALL + FCALL_RO calls: the throttle's
	metrics map[string]float64 // every worker's series, summed
}

func (f *bookFleet) snap(b *testing.B) bookSnap {
	b.Helper()
	s := bookSnap{at: time.Now(), metrics: map[string]float64{}}
	var err error
	if s.cost, err = readCost(context.Background(), f.admin); err != nil {
		b.Fatal(err)
	}
	stats, err := f.admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(stats, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "cmdstat_fcall" || name == "cmdstat_fcall_ro") {
			s.fcalls += statField(val, "calls")
		}
	}
	for _, w := range f.ws {
		series, err := scrapeSeries(w.metrics)
		if err != nil {
			b.Fatalf("worker %d: %v", w.n, err)
		}
		for k, v := range series {
			s.metrics[k] += v
		}
	}
	return s
}

// sum adds the series of metric name over its labels.
func (s bookSnap) sum(name string) float64 {
	var n float64
	for k, v := range s.metrics {
		if k == name || strings.HasPrefix(k, name+"{") {
			n += v
		}
	}
	return n
}

// histogram returns metric name's cumulative buckets (le -> count) and count.
func (s bookSnap) histogram(b *testing.B, name string) (map[float64]float64, float64) {
	cum := map[float64]float64{}
	for k, v := range s.metrics {
		if strings.HasPrefix(k, name+"_bucket{") {
			le, err := labelValue(k, "le")
			if err != nil {
				b.Fatalf("%s: %v", k, err)
			}
			cum[le] += v
		}
	}
	return cum, s.metrics[name+"_count"]
}

// lateness is the booking lateness histogram between two snapshots: p50,
// p99, the share within 1.5 s (a bucket bound: exact), and the count.
func lateness(b *testing.B, s0, s1 bookSnap) (p50, p99, within, n float64) {
	c0, n0 := s0.histogram(b, "throttler_booking_lateness_seconds")
	c1, n1 := s1.histogram(b, "throttler_booking_lateness_seconds")
	for le := range c1 {
		c1[le] -= c0[le]
	}
	n = n1 - n0
	if n == 0 {
		return 0, 0, 0, 0
	}
	return quantile(c1, n, 0.5), quantile(c1, n, 0.99), c1[1.5] / n, n
}

// lateVerdict says whether 99 % of n claims went within 1.5 s of their
// moment: "n/a" without claims.
func lateVerdict(n, within float64) string {
	if n == 0 {
		return "n/a: no claim"
	}
	return verdict(within >= 0.99)
}

// memoryUsage returns MEMORY USAGE of key (every element counted: SAMPLES 0)
// and its element count for a sorted set or hash.
func memoryUsage(ctx context.Context, rdb *redis.Client, key string) (bytes, elems int64) {
	bytes, _ = rdb.MemoryUsage(ctx, key, 0).Result()
	switch rdb.Type(ctx, key).Val() {
	case "zset":
		elems = rdb.ZCard(ctx, key).Val()
	case "hash":
		elems = rdb.HLen(ctx, key).Val()
	}
	return bytes, elems
}

// prefixMemory sums MEMORY USAGE over the keys that match pattern and do
// not start with except ("": none).
func prefixMemory(ctx context.Context, rdb *redis.Client, pattern, except string) (bytes, keys int64) {
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		if except != "" && strings.HasPrefix(iter.Val(), except) {
			continue
		}
		n, _ := rdb.MemoryUsage(ctx, iter.Val(), 0).Result()
		bytes, keys = bytes+n, keys+1
	}
	return bytes, keys
}

// waitingJobs counts the jobs asynq holds in every queue that are not
// done: pending, scheduled, in retry (deferred) and active.
func waitingJobs(insp *asynq.Inspector) (int64, error) {
	qs, err := insp.Queues()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, q := range qs {
		info, err := insp.GetQueueInfo(q)
		if err != nil {
			return 0, err
		}
		n += int64(info.Pending + info.Scheduled + info.Retry + info.Active)
	}
	return n, nil
}

// inPeriod counts the sorted times in [from, to).
func inPeriod(times []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range times {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// BenchmarkBacklog measures booking under a backlog, as the issue asks: a
// provider of 20/s (burst 5) that binds, a generous policy (1000 per hour,
// distinct recipients: it never binds), 2 worker processes with config.yaml's
// booking settings, and backlogs of 1k, 10k and 100k notifications queued
// before the workers start (-backlog.sizes), each on a fresh redis-server.
// Each backlog runs twice (-backlog.concurrency): with worker.concurrency 20
// (config.yaml's), whose 40 slots are fewer than rate x inline_wait = 50, so
// every job waits for its token inline and none books; and with 100, so that
// jobs book.
//
// The first pass is every queued job dequeued and admitted once (each books
// its moment): it ends when the workers' admission count has reached the
// backlog and the queue holds no more pending jobs than the workers' slots,
// so it is detected, not guessed (when no job has booked bookSettle in, the
// jobs are paced inline and the period starts then). The measuring period
// (-backlog.period, 30 s) starts bookSettle (5 s) after it. Per message
// delivered in the period it reports admission calls (the workers'
// throttler_admission_seconds count; FCALLs from INFO commandstats beside
// it), Redis commands (INFO commandstats, every command: asynq's included)
// and Redis CPU; the delivered rate over the provider's; the booking
// lateness (the moment a booked job went minus its booked moment:
// throttler_booking_lateness_seconds, p50, p99 and the share within 1.5 s);
// and MEMORY USAGE of the provider's keys at the end of the period. The jobs
// delivered in the period booked in the first pass: their lives cost the
// first pass's calls per job plus the period's per message, also logged.
// Before the backlogs, workers of concurrency 20 drain 2000 jobs through a
// provider that does not bind (10⁶/s): the unthrottled pipeline's commands
// per message, the baseline of the ratio.
//
// Targets (reported, not asserted; see bench_test.go): admission calls per
// delivered message <= 2.2 and flat across sizes, commands <= 2.5x the
// unthrottled pipeline's, delivered >= 0.98 of the provider's rate,
// lateness p99 <= 1.5 s. It fails when a message arrives twice, when the
// bucket's ledger shows more than burst + rate·T granted in an interval T,
// or when a worker delivers nothing or does not stop cleanly.
func BenchmarkBacklog(b *testing.B) {
	ctx := context.Background()
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := buildWorker(b, root)
	sizes, concs := numbers(b, "backlog.sizes", *backlogSizes), numbers(b, "backlog.concurrency", *backlogConc)

	// The baseline: the unthrottled pipeline, same binary and fleet.
	var plainCmds, plainCPU float64
	{
		const n = 2000
		f := newBookFleet(b, bin)
		if _, err := enqueueJobs(ctx, f.client, n, "plain-"); err != nil {
			b.Fatal(err)
		}
		done := f.hook.expect(n)
		c0 := f.snap(b)
		f.start(b, bookConcurrency, backlogPolicy, 1e6, 1000000)
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			b.Fatalf("unthrottled: not drained after 2m; worker logs:\n%s", workerLogs(f.ws))
		}
		if _, err := awaitEmpty(f.insp, 30*time.Second); err != nil {
			b.Fatal(err)
		}
		c1 := f.snap(b)
		f.requireEachSent(b)
		f.stop(b)
		cost := c1.cost.minus(c0.cost)
		plainCmds, plainCPU = cost.calls/n, cost.redisCPU/n
		b.Logf("unthrottled (provider 10⁶/s): %d messages, %.1f Redis commands, %.0f µs Redis CPU, %.2f admission calls per message",
			n, plainCmds, 1e6*plainCPU, c1.sum("throttler_admission_seconds_count")/n)
	}

	// The testing package prints a parent's log only when it fails: what
	// matters is logged by each sub-benchmark.
	for _, c := range concs {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("concurrency=%d,backlog=%d", c, n), func(b *testing.B) {
				backlogRun(b, bin, c, n, plainCmds, plainCPU)
			})
		}
	}
}

// backlogRun is one backlog of BenchmarkBacklog: n jobs, workers of
// concurrency c, against the unthrottled pipeline's commands and Redis CPU
// per message.
func backlogRun(b *testing.B, bin string, c, n int, plainCmds, plainCPU float64) {
	ctx := context.Background()
	f := newBookFleet(b, bin)
	enqStart := time.Now()
	if _, err := enqueueJobs(ctx, f.client, n, fmt.Sprintf("backlog%d-", n)); err != nil {
		b.Fatal(err)
	}
	enqTime := time.Since(enqStart)
	sStart := f.snap(b)
	started := sStart.at
	f.start(b, c, backlogPolicy, bookRate, bookBurst)
	booking := f.firstPass(b, n, 15*time.Minute)
	sPass := f.snap(b)
	passed := sPass.at
	_, _, passTimes := f.hook.arrivals()
	passDelivered := len(passTimes)
	if booking {
		time.Sleep(bookSettle) // the passage of time is the thing here: see bookSettle
	}
	s0 := f.snap(b)
	// The measuring period, in thirds: each third's admission calls per
	// message delivered in it show whether the period is steady.
	thirds := []bookSnap{s0}
	for range 3 {
		time.Sleep(*backlogPeriod / 3) // the passage of time is the thing here
		thirds = append(thirds, f.snap(b))
	}
	s1 := thirds[3]

	mem := map[string][2]int64{}
	for _, k := range []string{bucketStateKey, bucketBookKey, bucketSlotsKey, bucketFairKey, bucketTenantsKey} {
		by, el := memoryUsage(ctx, f.admin, k)
		mem[k] = [2]int64{by, el}
	}
	// Every key of the throttle's rules (the bucket's, the recipients'
	// quotas), against the jobs waiting in asynq: what the throttle holds
	// per waiting job. The messages' histories (lifecycle, "events:") are
	// kept apart: a message's, whether it waits or not.
	throttleBytes, throttleKeys := prefixMemory(ctx, f.admin, "throttle:*", "throttle:events:")
	historyBytes, historyKeys := prefixMemory(ctx, f.admin, "throttle:events:*", "")
	waiting, err := waitingJobs(f.insp)
	if err != nil {
		b.Fatal(err)
	}
	f.requireEachSent(b)
	f.stop(b)

	distinct, total, times := f.hook.arrivals()
	if total != distinct {
		b.Fatalf("backlog %d: the webhook got %d messages, %d distinct: some were sent twice", n, total, distinct)
	}
	delivered := inPeriod(times, s0.at, s1.at)
	period := s1.at.Sub(s0.at)
	if delivered == 0 {
		b.Fatalf("backlog %d: nothing delivered in the period (%d in all); metrics %v; worker logs:\n%s", n, distinct, s1.metrics, workerLogs(f.ws))
	}
	_, moments, err := grants(ctx, f.admin)
	if err != nil {
		b.Fatal(err)
	}
	most := newPacing(moments, moments[0]).maxWindow(time.Second)
	over, i, j := bucketOver(moments, bookRate, bookBurst)
	if over > 1e-3 {
		// Reported with the numbers, and failed: the bug of
		// throttle.TestBookLaterMomentKeepsTheBucket.
		b.Errorf("INVARIANT BROKEN: backlog %d: the bucket granted %d tokens within %s, %.3f more than burst + rate·T",
			n, j-i+1, moments[j].Sub(moments[i]), over)
	}

	d := float64(delivered)
	cost := s1.cost.minus(s0.cost)
	adm := (s1.sum("throttler_admission_seconds_count") - s0.sum("throttler_admission_seconds_count")) / d
	fc := (s1.fcalls - s0.fcalls) / d
	cmds := cost.calls / d
	rate := d / period.Seconds()
	p50, p99, within, late := lateness(b, s0, s1)
	made := s1.sum(`throttler_bookings_total{event="made"}`) - s0.sum(`throttler_bookings_total{event="made"}`)
	rebooked := s1.sum(`throttler_bookings_total{event="rebooked"}`) - s0.sum(`throttler_bookings_total{event="rebooked"}`)
	claimed := s1.sum(`throttler_bookings_total{event="claimed"}`) - s0.sum(`throttler_bookings_total{event="claimed"}`)

	b.Logf("backlog %d, per delivered message in the period (%d delivered): admission calls %.3f (target <= 2.2: %s), FCALL %.3f, Redis commands %.1f = %.2fx the unthrottled pipeline's %.1f (target <= 2.5x: %s), Redis CPU %.0f µs (unthrottled %.0f µs); Redis CPU %.1f%% of the period",
		n, delivered, adm, verdict(adm <= 2.2), fc, cmds, cmds/plainCmds, plainCmds, verdict(cmds <= 2.5*plainCmds),
		1e6*cost.redisCPU/d, 1e6*plainCPU, 100*cost.redisCPU/period.Seconds())
	var steady []string
	for i := 1; i < len(thirds); i++ {
		got := inPeriod(times, thirds[i-1].at, thirds[i].at)
		calls := thirds[i].sum("throttler_admission_seconds_count") - thirds[i-1].sum("throttler_admission_seconds_count")
		steady = append(steady, fmt.Sprintf("%.2f (%d delivered)", calls/float64(max(got, 1)), got))
	}
	b.Logf("backlog %d: admission calls per delivered message in each third of the period: %s", n, strings.Join(steady, ", "))
	b.Logf("backlog %d: delivered %.2f/s = %.3f of the provider's %d/s (target >= 0.98: %s); bookings made %.0f, claimed %.0f, rebooked %.0f; granted (ledger): most in 1 s %d (<= %d), excess over burst + rate·T %.3f (<= 0)",
		n, rate, rate/bookRate, bookRate, verdict(rate/bookRate >= 0.98), made, claimed, rebooked, most, bookRate+bookBurst, over)
	b.Logf("backlog %d: booking lateness over %.0f claims: p50 %.3f s, p99 %.3f s (target <= 1.5 s: %s), %.1f%% within 1.5 s",
		n, late, p50, p99, lateVerdict(late, within), 100*within)
	perWaiting := float64(throttleBytes) / float64(max(1, waiting))
	b.Logf("backlog %d: MEMORY USAGE: the rules' keys %d B (%d keys) for %d jobs waiting: %.1f B per waiting job (target <= 100: %s); the messages' histories %d B (%d keys, %.0f B each); bucket hash %d B (%d fields), slot calendar and ledger %d B (%d members: spans, marks, and the takes of the last remember_takes, 3m here), bookings %d B (%d tickets), tenants %d B (%d fields)",
		n, throttleBytes, throttleKeys, waiting, perWaiting, verdict(perWaiting <= 100), historyBytes, historyKeys, float64(historyBytes)/float64(max(1, historyKeys)),
		mem[bucketStateKey][0], mem[bucketStateKey][1],
		mem[bucketSlotsKey][0], mem[bucketSlotsKey][1], mem[bucketBookKey][0], mem[bucketBookKey][1], mem[bucketFairKey][0], mem[bucketFairKey][1])
	first := "first pass"
	if !booking {
		first = "no job booked: every job waits for its token inline, the queue is taken 2 x concurrency at a time; warm-up"
	}
	passAdm := sPass.sum("throttler_admission_seconds_count") / float64(n)
	b.Logf("backlog %d, concurrency %d: enqueued in %s; %s %s (%d delivered in it; per queued job %.2f admission calls, %.1f Redis commands); period %s from %s after the start",
		n, c, enqTime.Round(time.Millisecond), first, passed.Sub(started).Round(time.Millisecond), passDelivered,
		passAdm, sPass.cost.minus(sStart.cost).calls/float64(n), period.Round(time.Millisecond), s0.at.Sub(started).Round(time.Second))
	if booking {
		b.Logf("backlog %d: over a job's life (its booking in the first pass, then the period's calls per message): %.2f admission calls, %.1f Redis commands = %.2fx unthrottled",
			n, passAdm+adm, sPass.cost.minus(sStart.cost).calls/float64(n)+cmds, (sPass.cost.minus(sStart.cost).calls/float64(n)+cmds)/plainCmds)
	}
	b.ReportMetric(adm, "admissions/msg")
	b.ReportMetric(fc, "fcalls/msg")
	b.ReportMetric(cmds, "cmds/msg")
	b.ReportMetric(cmds/plainCmds, "cmds_vs_plain")
	b.ReportMetric(1e6*cost.redisCPU/d, "redis_cpu_us/msg")
	b.ReportMetric(rate/bookRate, "delivered/rate")
	b.ReportMetric(p50, "lateness_p50_s")
	b.ReportMetric(p99, "lateness_p99_s")
	b.ReportMetric(float64(mem[bucketBookKey][0]), "book_bytes")
	b.ReportMetric(float64(mem[bucketSlotsKey][0]), "slots_bytes")
	b.ReportMetric(perWaiting, "throttle_B/waiting_job")
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(0, "B/op")
	b.ReportMetric(0, "allocs/op")
}

// numbers parses the comma-separated positive numbers of flag name.
func numbers(b *testing.B, name, list string) []int {
	var ns []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			b.Fatalf("-%s: %q: want positive numbers", name, s)
		}
		ns = append(ns, n)
	}
	return ns
}

// grants returns the moment each task was granted to go (Redis time), by
// task ID, and all of them sorted: its quota entries' moment (what its
// recipient's windows were checked at), or for a task without one its
// bucket slot's start less the slack ((burst - 1) / rate: the earliest its
// slot lets it go). The ledger says which tasks took a slot. A quota set
// read at the end no longer holds the entries a later write pruned, and
// the slot's start less the slack is not their moment (see quotaWatch):
// only a policy that keeps every entry to the end makes these its
// recipients' moments.
func grants(ctx context.Context, rdb *redis.Client) (map[string]time.Time, []time.Time, error) {
	// The ledger's entries, in the calendar: "#" and the ID, scored minus
	// the slot's start.
	zs, err := rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: bucketSlotsKey, ByScore: true, Start: "-inf", Stop: "(0"}).Result()
	if err != nil {
		return nil, nil, err
	}
	quota := map[string]time.Time{}
	iter := rdb.Scan(ctx, 0, "throttle:{*}:q:*", 1000).Iterator()
	for iter.Next(ctx) {
		qs, err := rdb.ZRangeWithScores(ctx, iter.Val(), 0, -1).Result()
		if err != nil {
			return nil, nil, err
		}
		for _, z := range qs {
			id, _, _ := strings.Cut(fmt.Sprint(z.Member), "\x1f")
			quota[id] = time.UnixMicro(int64(z.Score))
		}
	}
	if err := iter.Err(); err != nil {
		return nil, nil, err
	}
	slack := time.Duration(float64(bookBurst-1) / bookRate * float64(time.Second))
	by := map[string]time.Time{}
	var at []time.Time
	for _, z := range zs {
		id := strings.TrimPrefix(fmt.Sprint(z.Member), "#")
		g, ok := quota[id]
		if !ok {
			g = time.UnixMicro(-int64(z.Score)).Add(-slack)
		}
		by[id] = g
		at = append(at, g)
	}
	if len(at) == 0 {
		return nil, nil, fmt.Errorf("the ledger in %s is empty", bucketSlotsKey)
	}
	slices.SortFunc(at, time.Time.Compare)
	return by, at, nil
}

// enqueueOn enqueues one notification to recipient on queue and returns its ID.
func enqueueOn(ctx context.Context, client *asynq.Client, queue, recipient string) (string, error) {
	id := message.TaskID("")
	nt := message.Notification{Recipient: recipient, Policy: benchPolicy, Provider: bookProvider, Template: benchTemplate, Data: []byte(`{}`)}
	task, err := message.NewTask(nt, id, asynq.Queue(queue))
	if err == nil {
		_, err = client.EnqueueContext(ctx, task)
	}
	return id, err
}

// firstPass waits until every one of n queued jobs has been admitted once:
// the workers' admission count has reached n and the queue holds no more
// pending jobs than the workers have slots. It returns false, after
// bookSettle, when no job booked by then: the workers' slots are fewer than
// rate x inline_wait, so every job waits for its token inline and the pass
// would last n / rate.
func (f *bookFleet) firstPass(b *testing.B, n int, timeout time.Duration) bool {
	b.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		q, err := f.insp.GetQueueInfo(benchQueue)
		s := f.snap(b)
		if err == nil && s.sum("throttler_admission_seconds_count") >= float64(n) && q.Pending <= bookWorkers*f.slots {
			return true
		}
		if time.Since(start) > bookSettle && s.sum(`throttler_bookings_total{event="made"}`) == 0 {
			return false
		}
		if time.Now().After(deadline) {
			b.Fatalf("first pass of %d jobs not over after %s: %+v (%v); worker logs:\n%s", n, timeout, q, err, workerLogs(f.ws))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// burstWindows is BenchmarkRecipientBurst's policy.
var burstWindows = []struct {
	limit int
	per   time.Duration
}{{1, 2 * time.Second}, {3, 10 * time.Second}}

// windowsAllow returns how many messages windows, each held margin longer
// (worker.window_margin), let one recipient send in a period of length p
// from a fresh start, each at the earliest moment every window allows.
func windowsAllow(p, margin time.Duration) int {
	var sent []time.Duration
	at := time.Duration(0)
	for at < p {
		sent = append(sent, at)
		next := at
		for _, w := range burstWindows {
			if len(sent) >= w.limit {
				next = max(next, sent[len(sent)-w.limit]+w.per+margin)
			}
		}
		at = next
	}
	return len(sent)
}

// BenchmarkRecipientBurst: 20 recipients x 20 messages under the policy 1 per
// 2 s and 3 per 10 s, enqueued in order (message k of every recipient before
// message k+1 of any), through a provider that does not bind (1000/s), 2
// worker processes with config.yaml's booking settings, once for each
// worker.inline_wait of -burst.inline_wait (0s, 1s and config.yaml's 2.5s:
// inline_wait=D). Reported: admission calls per delivered message over the
// whole run (target <= 2.2); messages delivered within 60 s of the first
// arrival against what the windows allow in 60 s from a fresh start, each
// held worker.window_margin (250 ms) longer (18 per recipient: 360; target
// >= 0.97); and, per recipient, messages that arrived before one enqueued
// earlier for the same recipient (out of order). It fails when a message is
// lost or arrives twice, or a recipient gets more than a window allows by
// the moments its quota entries were granted (recorded while it runs:
// quotaWatch) or by the arrival times (500 ms of delivery jitter allowed).
func BenchmarkRecipientBurst(b *testing.B) {
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := buildWorker(b, root)
	for _, d := range strings.Split(*burstInline, ",") {
		d = strings.TrimSpace(d)
		if _, err := time.ParseDuration(d); err != nil {
			b.Fatalf("-burst.inline_wait: %q: %v", d, err)
		}
		b.Run("inline_wait="+d, func(b *testing.B) { burstRun(b, bin, d) })
	}
}

// burstRun is BenchmarkRecipientBurst with worker.inline_wait inline.
func burstRun(b *testing.B, bin, inline string) {
	const (
		recipients = 20
		per        = 20
		n          = recipients * per
		period     = 60 * time.Second
		tolerance  = 500 * time.Millisecond
	)
	ctx := context.Background()
	f := newBookFleet(b, bin)
	f.inlineWait = inline
	if *burstMonitor != "" {
		monitorTo(b, f.srv.Addr, *burstMonitor)
	}
	rcpts := make([]string, recipients)
	for r := range rcpts {
		rcpts[r] = fmt.Sprintf("burst%02d@example.com", r)
	}
	rank := map[string]int{}           // task ID -> k
	recipientOf := map[string]string{} // task ID -> recipient
	for k := range per {
		for _, rcpt := range rcpts {
			id, err := enqueueOn(ctx, f.client, benchQueue, rcpt)
			if err != nil {
				b.Fatal(err)
			}
			rank[id], recipientOf[id] = k, rcpt
		}
	}
	watch := watchQuotas(f.admin, rcpts)
	done := f.hook.expect(n)
	f.start(b, bookConcurrency, "[{limit: 1, per: 2s}, {limit: 3, per: 10s}]", 1000, 100)
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		distinct, _, _ := f.hook.arrivals()
		b.Fatalf("%d of %d delivered after 4m; worker logs:\n%s", distinct, n, workerLogs(f.ws))
	}
	if _, err := awaitEmpty(f.insp, 30*time.Second); err != nil {
		b.Fatalf("%v; worker logs:\n%s", err, workerLogs(f.ws))
	}
	s := f.snap(b)
	f.requireEachSent(b)
	f.stop(b)

	distinct, total, times := f.hook.arrivals()
	if distinct != n || total != n {
		b.Fatalf("the webhook got %d messages (%d distinct), want %d once each", total, distinct, n)
	}
	ledger, _, err := grants(ctx, f.admin)
	if err != nil {
		b.Fatal(err)
	}
	granted, err := watch.moments(ctx)
	if err != nil {
		b.Fatal(err)
	}
	arrived := f.hook.firstArrivals()
	byRecipient := map[string][]string{} // IDs in the order granted
	ids := make([]string, 0, n)
	for id := range arrived {
		if _, ok := ledger[id]; !ok {
			b.Fatalf("task %s arrived without a token of the provider", id)
		}
		if _, ok := granted[id]; !ok {
			b.Fatalf("task %s arrived without a quota entry of its recipient", id)
		}
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, c string) int { return granted[a].Compare(granted[c]) })
	var moments []time.Time
	for _, id := range ids {
		byRecipient[recipientOf[id]] = append(byRecipient[recipientOf[id]], id)
		moments = append(moments, granted[id])
	}
	outOfOrder, worstRecipient := 0, 0
	tightest := map[time.Duration][2]time.Duration{} // window -> closest as granted, as arrived
	for _, got := range byRecipient {
		late := 0
		for i, id := range got { // one that went before an earlier-enqueued one
			for _, later := range got[i+1:] {
				if rank[later] < rank[id] {
					late++
					break
				}
			}
		}
		outOfOrder += late
		worstRecipient = max(worstRecipient, late)
		at := make([]time.Time, len(got))
		for i, id := range got {
			at[i] = arrived[id]
		}
		slices.SortFunc(at, time.Time.Compare)
		for _, w := range burstWindows {
			for i := 0; i+w.limit < len(got); i++ {
				g, a := granted[got[i+w.limit]].Sub(granted[got[i]]), at[i+w.limit].Sub(at[i])
				old, ok := tightest[w.per]
				if !ok {
					old = [2]time.Duration{g, a}
				}
				tightest[w.per] = [2]time.Duration{min(old[0], g), min(old[1], a)}
				if g < w.per || a < w.per-tolerance {
					for _, id := range got {
						b.Logf("  %s: granted %s, arrived %s", id, granted[id].Format("15:04:05.000000"), arrived[id].Format("15:04:05.000000"))
					}
					b.Fatalf("recipient %s: %d messages within %s as granted, %s as arrived; the policy allows %d per %s",
						recipientOf[got[i]], w.limit+1, g, a, w.limit, w.per)
				}
			}
		}
	}
	delivered := inPeriod(moments, moments[0], moments[0].Add(period))
	allowed := recipients * windowsAllow(period, bookWindowMargin)
	adm := s.sum("throttler_admission_seconds_count") / n
	p50, p99, within, late := lateness(b, bookSnap{}, s)
	b.Logf("inline_wait %s, window_margin %s: %d recipients x %d messages, drained in %s: admission calls %.3f per message (target <= 2.2: %s), FCALL %.3f; bookings made %.0f, rebooked %.0f, claimed %.0f",
		inline, bookWindowMargin, recipients, per, newPacing(times, times[0]).span().Round(time.Millisecond), adm, verdict(adm <= 2.2), s.fcalls/n,
		s.sum(`throttler_bookings_total{event="made"}`), s.sum(`throttler_bookings_total{event="rebooked"}`), s.sum(`throttler_bookings_total{event="claimed"}`))
	b.Logf("sent within %s of the first (granted moments): %d, the windows allow %d: %.3f (target >= 0.97: %s)",
		period, delivered, allowed, float64(delivered)/float64(allowed), verdict(float64(delivered) >= 0.97*float64(allowed)))
	b.Logf("out of enqueue order: %d of %d messages (at most %d of one recipient's %d); closest to one recipient, granted/arrived: 2 within %s/%s (window 2 s), 4 within %s/%s (window 10 s)",
		outOfOrder, n, worstRecipient, per, tightest[2*time.Second][0].Round(time.Millisecond), tightest[2*time.Second][1].Round(time.Millisecond),
		tightest[10*time.Second][0].Round(time.Millisecond), tightest[10*time.Second][1].Round(time.Millisecond))
	b.Logf("booking lateness over %.0f claims: p50 %.3f s, p99 %.3f s, %.1f%% within 1.5 s", late, p50, p99, 100*within)
	b.ReportMetric(adm, "admissions/msg")
	b.ReportMetric(float64(delivered)/float64(allowed), "delivered/allowed")
	b.ReportMetric(float64(outOfOrder), "out_of_order")
	b.ReportMetric(newPacing(times, times[0]).span().Seconds(), "drain_s")
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(0, "B/op")
	b.ReportMetric(0, "allocs/op")
}

// monitorTo records every command the server runs (scripts' included)
// into path until the benchmark ends: for finding how a window broke.
func monitorTo(b *testing.B, addr, path string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		b.Fatal(err)
	}
	out, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("redis-cli", "-h", host, "-p", port, "monitor")
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = out.Close() })
}

// bucketOver returns the largest excess of times (sorted) over a token
// bucket: max over i <= j of (j-i+1) - burst - rate·(t[j]-t[i]), at most 0
// when the bucket held, and the i and j where it is.
func bucketOver(times []time.Time, rate float64, burst int) (over float64, from, to int) {
	over = -float64(burst)
	for i := range times {
		for j := i; j < len(times); j++ {
			if e := float64(j-i+1) - float64(burst) - rate*times[j].Sub(times[i]).Seconds(); e > over {
				over, from, to = e, i, j
			}
		}
	}
	return over, from, to
}

// BenchmarkPriority: 2000 notifications queued on queue default to a
// provider of 20/s (burst 5, priority_reserve 1: config.yaml's default of
// burst/5), booked by 2 worker processes with config.yaml's booking settings
// (priority_queues: [critical]); after the first pass, one notification on
// queue critical every 500 ms for 30 s. Reported: the latency of the
// critical ones from enqueue to arrival at the webhook, p50, p99 (target
// <= 1 s) and most; the bulk messages delivered meanwhile; and the provider's
// bucket, checked on the granted moments (its ledger: must hold exactly,
// else the benchmark fails) and on arrivals at the webhook (at most
// burst + rate·(T + 0.5 s) in any interval T: 0.5 s of delivery jitter).
func BenchmarkPriority(b *testing.B) {
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := buildWorker(b, root)
	for _, c := range numbers(b, "backlog.concurrency", *backlogConc) {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) { priorityRun(b, bin, c) })
	}
}

// priorityRun is BenchmarkPriority with workers of concurrency c.
func priorityRun(b *testing.B, bin string, c int) {
	const (
		bulk     = 2000
		every    = 500 * time.Millisecond
		critical = 60
	)
	ctx := context.Background()
	f := newBookFleet(b, bin)
	if _, err := enqueueJobs(ctx, f.client, bulk, "bulk-"); err != nil {
		b.Fatal(err)
	}
	f.start(b, c, backlogPolicy, bookRate, bookBurst)
	if f.firstPass(b, bulk, 5*time.Minute) {
		time.Sleep(bookSettle) // the passage of time is the thing here: see bookSettle
	} else {
		b.Logf("concurrency %d: no bulk job booked: each waits for its token inline, holding a slot", c)
	}
	_, _, before := f.hook.arrivals()
	enqueued := map[string]time.Time{}
	tick := time.NewTicker(every)
	for i := range critical {
		id, err := enqueueOn(ctx, f.client, "critical", fmt.Sprintf("otp%03d@example.com", i))
		if err != nil {
			b.Fatal(err)
		}
		enqueued[id] = time.Now()
		<-tick.C
	}
	tick.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		first := f.hook.firstArrivals()
		missing := 0
		for id := range enqueued {
			if _, ok := first[id]; !ok {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d critical messages not delivered 30 s after the last was enqueued; worker logs:\n%s", missing, critical, workerLogs(f.ws))
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.requireEachSent(b)
	byTask, moments, err := grants(ctx, f.admin)
	if err != nil {
		b.Fatal(err)
	}
	f.stop(b)

	first := f.hook.firstArrivals()
	var lat []time.Duration
	var last time.Time
	for id, at := range enqueued {
		lat = append(lat, first[id].Sub(at))
		if first[id].After(last) {
			last = first[id]
		}
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	distinct, total, times := f.hook.arrivals()
	if total != distinct {
		b.Fatalf("the webhook got %d messages, %d distinct: some were sent twice", total, distinct)
	}
	var from time.Time
	for _, at := range enqueued {
		if from.IsZero() || at.Before(from) {
			from = at
		}
	}
	bulkDuring := inPeriod(times, from, last) - critical
	overGranted, i, j := bucketOver(moments, bookRate, bookBurst)
	overArrived, _, _ := bucketOver(times, bookRate, bookBurst)
	if overGranted > 1e-3 {
		var which []string
		for id, at := range byTask {
			if !at.Before(moments[i]) && !at.After(moments[j]) {
				kind := "bulk"
				if _, ok := enqueued[id]; ok {
					kind = "critical"
				}
				which = append(which, fmt.Sprintf("%s %s", at.Format("15:04:05.000000"), kind))
			}
		}
		slices.Sort(which)
		// Reported with the numbers, and failed: the bug of
		// throttle.TestBookLaterMomentKeepsTheBucket.
		b.Errorf("INVARIANT BROKEN: the granted moments exceed the bucket (%d/s burst %d) by %.3f tokens: %d within %s: %v",
			bookRate, bookBurst, overGranted, j-i+1, moments[j].Sub(moments[i]), which)
	}
	b.Logf("%d bulk queued, %d delivered before the first critical one; %d critical, one every %s: enqueue -> arrival p50 %s, p99 %s (target <= 1 s: %s), most %s; %d bulk delivered meanwhile (%.1f/s)",
		bulk, len(before), critical, every, q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond),
		verdict(q(0.99) <= time.Second), lat[len(lat)-1].Round(time.Millisecond), bulkDuring, float64(bulkDuring)/last.Sub(from).Seconds())
	b.Logf("provider %d/s burst %d: excess over burst + rate·T in any interval: granted moments %.3f (must be <= 0), arrivals %.2f (allowed %.1f: 0.5 s of jitter: %s)",
		bookRate, bookBurst, overGranted, overArrived, bookRate*0.5, verdict(overArrived <= bookRate*0.5))
	b.ReportMetric(q(0.5).Seconds(), "critical_p50_s")
	b.ReportMetric(q(0.99).Seconds(), "critical_p99_s")
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(0, "B/op")
	b.ReportMetric(0, "allocs/op")
}
