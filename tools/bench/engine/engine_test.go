// Package engine benchmarks the throttle engine against real redis-server
// processes (one per benchmark function) and against the baselines it must
// beat, run by `make bench`:
//
//	cd tools && go test -run '^$' -bench . -benchmem ./bench/engine/
//
// It lives in the tools module because a baseline, go-redis/redis_rate, is
// a dependency of the comparison and not of the product.
//
// The machine running them usually shares its few cores between Redis and the
// Go client, so absolute numbers are noisy. What matters are the ratios that
// the *Vs* benchmarks measure side by side in one run, on one server, with the
// variants interleaved over a few rounds so that drift (CPU frequency, other
// load, a growing keyspace) hits all of them alike:
//
//	BenchmarkAdmitVsBaselines     engine/redis_rate (target >= 1.0), engine/trivial (>= 0.6)
//	BenchmarkQuotaMemory          bytes/recipient of the 1/24h + 3/168h quota at steady state
//
// The job shape throughout is the notification job: a recipient quota of
// 1 per 24h AND 3 per 168h plus a provider bucket (100000/s burst 1000, so the
// bucket itself never denies), a distinct task ID per admission, recipients
// cycling over benchRecipients addresses. Before anything is measured every
// one of those recipients has been admitted once, so the measured admissions
// are in steady state: with 1 per 24h a recycled recipient is denied by its
// quota. The "engine_admitted" variants give every admission a recipient of
// its own instead, so every one is admitted and takes the engine's full write
// path (quota ZADD and PEXPIRE, bucket HSET and PEXPIRE, ledger prune, ZADD
// and PEXPIRE GT). The engine runs as a Redis Functions library (FCALL); the
// baselines are scripts (EVALSHA), as their libraries ship them.
//
// -throttle.round sets how long each variant runs per round in the *Vs*
// benchmarks (default 1s; 3 rounds).
package engine

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/cpustat"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/throttle"
)

var benchRound = flag.Duration("throttle.round", time.Second, "how long each variant runs per round in the side-by-side throttle benchmarks")

const (
	benchWorkers    = 64    // concurrent callers (and go-redis PoolSize)
	benchRecipients = 10000 // recipients the cycling job shape goes through
	benchRounds     = 3     // interleaved rounds of the side-by-side benchmarks
	benchQuota      = "marketing"
	benchProvider   = "sendgrid"
)

// benchTrivialSrc is the floor a one-call Lua admission cannot beat: the
// script invocation itself, Redis TIME and one read of the recipient's key.
const benchTrivialSrc = `redis.call('TIME')
return redis.call('ZCARD', KEYS[1])`

// benchEnv is one redis-server with everything the variants need.
type benchEnv struct {
	rdb        *redis.Client // PoolSize benchWorkers
	lim        *throttle.Limiter
	rl         *redis_rate.Limiter
	trivial    *redis.Script
	quota      *throttle.Quota
	bucket     *throttle.Bucket
	recipients []string
	next       atomic.Uint64 // numbers task IDs and picks recipients
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:     redistest.Start(b).Addr,
		PoolSize: benchWorkers,
	})
	b.Cleanup(func() { _ = rdb.Close() })
	e := &benchEnv{
		rdb:     rdb,
		lim:     mustLimiter(b, rdb),
		rl:      redis_rate.NewLimiter(rdb),
		trivial: redis.NewScript(benchTrivialSrc),
		quota:   mustQuota(b, benchQuota, throttle.Window{Limit: 1, Per: 24 * time.Hour}, throttle.Window{Limit: 3, Per: 168 * time.Hour}),
		bucket:  mustBucket(b, benchProvider, 100000, 1000),
	}
	e.recipients = make([]string, benchRecipients)
	for i := range e.recipients {
		e.recipients[i] = fmt.Sprintf("user%05d@example.com", i)
	}
	return e
}

// quotaKey returns the engine's key of a recipient's benchQuota entries
// (internal/keyspace: prefix, hash tag, kind, rule), for recipients whose
// addresses the engine keeps as they are. BenchmarkQuotaMemory fails if the
// engine does not read the keys built here.
func quotaKey(recipient string) string {
	return throttle.DefaultPrefix + "{" + recipient + "}:q:" + benchQuota
}

func mustLimiter(b *testing.B, rdb redis.UniversalClient) *throttle.Limiter {
	b.Helper()
	l, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	return l
}

func mustQuota(b *testing.B, name string, ws ...throttle.Window) *throttle.Quota {
	b.Helper()
	q, err := throttle.NewQuota(name, ws...)
	if err != nil {
		b.Fatalf("NewQuota: %v", err)
	}
	return q
}

func mustBucket(b *testing.B, name string, rate float64, burst int) *throttle.Bucket {
	b.Helper()
	bk, err := throttle.NewBucket(name, rate, burst)
	if err != nil {
		b.Fatalf("NewBucket: %v", err)
	}
	return bk
}

// benchID returns a task ID shaped like the UUIDs message.TaskID gives (36
// bytes), unique per n, without the cost of generating a random one.
func benchID(n uint64) string {
	const prefix, hex = "6f1d5a0e-3c55-4b8e-9a43-", "0123456789abcdef"
	var buf [36]byte
	copy(buf[:], prefix)
	for i := len(buf) - 1; i >= len(prefix); i-- {
		buf[i] = hex[n&15]
		n >>= 4
	}
	return string(buf[:])
}

// job is the notification job of one task to one recipient.
func (e *benchEnv) job(n uint64, recipient string) throttle.Request {
	return throttle.Request{ID: benchID(n), Takes: []throttle.Take{
		{Rule: e.quota, Subject: recipient},
		{Rule: e.bucket, Subject: benchProvider},
	}}
}

func (e *benchEnv) cycling(n uint64) string { return e.recipients[n%benchRecipients] }

func benchFresh(n uint64) string { return "new" + strconv.FormatUint(n, 10) + "@example.com" }

// benchOp is one call of a variant: it reports how many decisions it made
// and how many of them admitted.
type benchOp func(ctx context.Context) (ops, admitted int64, err error)

func (e *benchEnv) admitOp(recipient func(uint64) string) benchOp {
	return func(ctx context.Context) (int64, int64, error) {
		n := e.next.Add(1)
		d, err := e.lim.Admit(ctx, e.job(n, recipient(n)))
		if err != nil {
			return 0, 0, err
		}
		return 1, benchB2I(d.Allowed()), nil
	}
}

func (e *benchEnv) trivialOp() benchOp {
	return func(ctx context.Context) (int64, int64, error) {
		n := e.next.Add(1)
		key := quotaKey(e.cycling(n))
		if err := e.trivial.Run(ctx, e.rdb, []string{key}).Err(); err != nil {
			return 0, 0, err
		}
		return 1, 1, nil
	}
}

func (e *benchEnv) redisRateOp() benchOp {
	limit := redis_rate.PerSecond(100000)
	return func(ctx context.Context) (int64, int64, error) {
		n := e.next.Add(1)
		res, err := e.rl.Allow(ctx, e.cycling(n), limit)
		if err != nil {
			return 0, 0, err
		}
		return 1, int64(res.Allowed), nil
	}
}

func benchB2I(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// settle admits every cycling recipient once, from benchWorkers goroutines,
// so that what is measured afterwards is the steady state rather than first
// admissions.
func (e *benchEnv) settle(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, benchWorkers)
	for range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < benchRecipients; i = next.Add(1) - 1 {
				if _, err := e.lim.Admit(ctx, e.job(e.next.Add(1), e.recipients[i])); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("settle: %v", err)
	}
}

// benchParallel runs op b.N times from benchWorkers goroutines (RunParallel with
// GOMAXPROCS*parallelism = workers) and reports decisions/s and %admitted.
func benchParallel(b *testing.B, workers int, op benchOp) {
	b.Helper()
	procs := runtime.GOMAXPROCS(0)
	if workers%procs != 0 {
		b.Logf("%d workers is not a multiple of GOMAXPROCS %d: running %d", workers, procs, (workers+procs-1)/procs*procs)
	}
	b.SetParallelism((workers + procs - 1) / procs)
	var ops, admitted atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		var o, a int64
		for pb.Next() {
			n, k, err := op(ctx)
			if err != nil {
				b.Error(err)
				break
			}
			o, a = o+n, a+k
		}
		ops.Add(o)
		admitted.Add(a)
	})
	b.StopTimer()
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(ops.Load())/s, "decisions/s")
	}
	if o := ops.Load(); o > 0 {
		b.ReportMetric(100*float64(admitted.Load())/float64(o), "%admitted")
	}
}

// benchCount is what a variant did in some wall time.
type benchCount struct {
	ops, admitted     int64
	elapsed           time.Duration
	allocs, allocByte uint64
}

func (c benchCount) rate() float64 { return float64(c.ops) / c.elapsed.Seconds() }

func (c *benchCount) add(d benchCount) {
	c.ops += d.ops
	c.admitted += d.admitted
	c.elapsed += d.elapsed
	c.allocs += d.allocs
	c.allocByte += d.allocByte
}

// benchRunFor runs op from workers goroutines for d of wall time. Ops still in
// flight at d are waited for and counted, and so is their time.
func benchRunFor(workers int, d time.Duration, op benchOp) (benchCount, error) {
	var (
		stop          atomic.Bool
		ops, admitted atomic.Int64
		wg            sync.WaitGroup
		errOnce       sync.Once
		firstErr      error
		m0, m1        runtime.MemStats
	)
	ctx := context.Background()
	runtime.ReadMemStats(&m0)
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for range workers {
		wg.Go(func() {
			var o, a int64
			for !stop.Load() {
				n, k, err := op(ctx)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					break
				}
				o, a = o+n, a+k
			}
			ops.Add(o)
			admitted.Add(a)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&m1)
	return benchCount{
		ops: ops.Load(), admitted: admitted.Load(), elapsed: elapsed,
		allocs: m1.Mallocs - m0.Mallocs, allocByte: m1.TotalAlloc - m0.TotalAlloc,
	}, firstErr
}

// benchVariant is one contender of a side-by-side benchmark.
type benchVariant struct {
	name    string
	workers int
	op      benchOp
}

// benchSideBySide warms every variant up, then runs them in benchRounds
// rounds of *benchRound each, in a rotated order per round, and returns their
// totals.
// It logs each round, and per variant where the time went: Redis time in
// EVAL/EVALSHA/FCALL (INFO commandstats), the server's CPU (INFO cpu) and this
// process's CPU (/proc/self/stat), each per decision.
func benchSideBySide(b *testing.B, e *benchEnv, vs []benchVariant) map[string]benchCount {
	b.Helper()
	for _, v := range vs {
		if _, err := benchRunFor(v.workers, 200*time.Millisecond, v.op); err != nil {
			b.Fatalf("%s: warm-up: %v", v.name, err)
		}
	}
	total := map[string]benchCount{}
	spent := map[string]benchStats{}
	for r := range benchRounds {
		var line []string
		for k := range vs {
			v := vs[(k+r)%len(vs)]
			s0 := e.stats(b)
			c, err := benchRunFor(v.workers, *benchRound, v.op)
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			spent[v.name] = spent[v.name].plus(e.stats(b).minus(s0))
			t := total[v.name]
			t.add(c)
			total[v.name] = t
			line = append(line, fmt.Sprintf("%s %.0f/s", v.name, c.rate()))
		}
		b.Logf("round %d: %s", r+1, strings.Join(line, ", "))
	}
	for _, v := range vs {
		c, s := total[v.name], spent[v.name]
		ops := float64(c.ops)
		b.Logf("%-16s %6.0f decisions/s, %5.1f%% admitted; per decision: Redis in scripts %5.1fµs, Redis CPU %5.1fµs, client CPU %5.1fµs",
			v.name+":", c.rate(), 100*float64(c.admitted)/ops, s.evalUsec/ops, 1e6*s.serverCPU/ops, 1e6*s.clientCPU/ops)
	}
	return total
}

// benchStats is what the server and this process have spent so far.
type benchStats struct {
	evalUsec  float64 // µs Redis spent in EVAL, EVALSHA and FCALL (INFO commandstats)
	serverCPU float64 // s of redis-server CPU, user + sys (INFO cpu)
	clientCPU float64 // s of this process's CPU, user + sys; 0 if unknown
}

func (s benchStats) minus(t benchStats) benchStats {
	return benchStats{s.evalUsec - t.evalUsec, s.serverCPU - t.serverCPU, s.clientCPU - t.clientCPU}
}

func (s benchStats) plus(t benchStats) benchStats {
	return benchStats{s.evalUsec + t.evalUsec, s.serverCPU + t.serverCPU, s.clientCPU + t.clientCPU}
}

func (e *benchEnv) stats(b *testing.B) benchStats {
	b.Helper()
	info, err := e.rdb.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var s benchStats
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_fcall":
			for _, f := range strings.Split(val, ",") {
				if u, ok := strings.CutPrefix(f, "usec="); ok {
					x, _ := strconv.ParseFloat(u, 64)
					s.evalUsec += x
				}
			}
		case "used_cpu_user", "used_cpu_sys":
			x, _ := strconv.ParseFloat(val, 64)
			s.serverCPU += x
		}
	}
	s.clientCPU = cpustat.Self()
	return s
}

// benchReport reports every variant's decisions/s and the ratios asked for,
// and makes ns/op, B/op and allocs/op those of the variant named main (per
// decision, ns/op throughput-wise like RunParallel's).
func benchReport(b *testing.B, total map[string]benchCount, main string, ratios [][2]string) {
	b.Helper()
	for name, c := range total {
		b.ReportMetric(c.rate(), name+"_decisions/s")
	}
	for _, r := range ratios {
		b.ReportMetric(total[r[0]].rate()/total[r[1]].rate(), r[0]+"/"+r[1])
	}
	m := total[main]
	b.ReportMetric(1e9/m.rate(), "ns/op")
	b.ReportMetric(float64(m.allocByte)/float64(m.ops), "B/op")
	b.ReportMetric(float64(m.allocs)/float64(m.ops), "allocs/op")
}

// BenchmarkAdmit measures, one at a time with 64 concurrent callers, the
// engine's admission of the notification job and the two baselines.
func BenchmarkAdmit(b *testing.B) {
	e := newBenchEnv(b)
	e.settle(b)
	b.Run("engine", func(b *testing.B) { benchParallel(b, benchWorkers, e.admitOp(e.cycling)) })
	b.Run("engine_admitted", func(b *testing.B) { benchParallel(b, benchWorkers, e.admitOp(benchFresh)) })
	b.Run("trivial_script", func(b *testing.B) { benchParallel(b, benchWorkers, e.trivialOp()) })
	b.Run("redis_rate", func(b *testing.B) { benchParallel(b, benchWorkers, e.redisRateOp()) })
}

// BenchmarkAdmitVsBaselines runs the engine and the baselines side by side
// for the same wall time and reports the ratios of their throughputs:
// engine/redis_rate (target >= 1.0) and engine/trivial (target >= 0.6), for
// the steady-state job (engine: recycled recipients, denied by their quota)
// and for the all-admitted one (engine_admitted).
func BenchmarkAdmitVsBaselines(b *testing.B) {
	e := newBenchEnv(b)
	e.settle(b)
	total := benchSideBySide(b, e, []benchVariant{
		{"engine", benchWorkers, e.admitOp(e.cycling)},
		{"engine_admitted", benchWorkers, e.admitOp(benchFresh)},
		{"trivial", benchWorkers, e.trivialOp()},
		{"redis_rate", benchWorkers, e.redisRateOp()},
	})
	benchReport(b, total, "engine", [][2]string{
		{"engine", "redis_rate"}, {"engine", "trivial"},
		{"engine_admitted", "redis_rate"}, {"engine_admitted", "trivial"},
	})
}

// BenchmarkAdmitZoned runs the engine's job side by side with the same job
// plus what a policy in the recipient's zone adds: a calendar day window
// (1 per day) and quiet hours that do not hold now, placed in
// America/New_York as the worker places them; and reports zoned/engine,
// mostly denied and all admitted.
func BenchmarkAdmitZoned(b *testing.B) {
	e := newBenchEnv(b)
	e.settle(b)
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	cal, err := throttle.NewCalendar(benchQuota+".day", 1, throttle.Day, time.Monday)
	if err != nil {
		b.Fatal(err)
	}
	h := now.In(loc).Hour()
	r, err := throttle.ParseQuietRange(fmt.Sprintf("%02d:00-%02d:00", (h+6)%24, (h+8)%24)) // not now
	if err != nil {
		b.Fatal(err)
	}
	quiet, err := throttle.NewQuietHours(benchQuota, r)
	if err != nil {
		b.Fatal(err)
	}
	day, hours := cal.In(loc, now), quiet.In(loc, now)
	zoned := func(recipient func(uint64) string) benchOp {
		return func(ctx context.Context) (int64, int64, error) {
			n := e.next.Add(1)
			j := e.job(n, recipient(n))
			j.Takes = append(j.Takes, throttle.Take{Rule: day, Subject: j.Takes[0].Subject}, throttle.Take{Rule: hours, Subject: j.Takes[0].Subject})
			d, err := e.lim.Admit(ctx, j)
			if err != nil {
				return 0, 0, err
			}
			return 1, benchB2I(d.Allowed()), nil
		}
	}
	total := benchSideBySide(b, e, []benchVariant{
		{"engine", benchWorkers, e.admitOp(e.cycling)},
		{"zoned", benchWorkers, zoned(e.cycling)},
		{"engine_admitted", benchWorkers, e.admitOp(benchFresh)},
		{"zoned_admitted", benchWorkers, zoned(benchFresh)},
	})
	benchReport(b, total, "zoned", [][2]string{{"zoned", "engine"}, {"zoned_admitted", "engine_admitted"}})
}

// BenchmarkQuotaMemory measures the Redis memory one recipient costs with the
// 1 per 24h + 3 per 168h quota in steady state: three entries in the week, at
// most one a day. Time comes from Redis, so the entries are written with ZADD
// at past scores under the keys the engine builds (and with the expiry its
// last commit would have set); then every recipient is admitted once for
// real and must be denied by the 3 per 168h window, proving that this is the
// state the engine reads. Reported: MEMORY USAGE of one quota key, and the
// growth of INFO used_memory per recipient (keyspace overhead included). The
// timed part is steady-state denied admissions of those recipients.
func BenchmarkQuotaMemory(b *testing.B) {
	const n = benchRecipients
	e := newBenchEnv(b) // its pool opens no connection before the measurement
	ctx := context.Background()
	day := int64(24 * time.Hour / time.Microsecond)

	// Memory is read on a connection of its own, with every other connection
	// closed: 64 connections' buffers weigh about as much as the recipients.
	addr := e.rdb.Options().Addr
	meter := redis.NewClient(&redis.Options{Addr: addr, Password: e.rdb.Options().Password, PoolSize: 1})
	defer meter.Close()
	// Before the baseline: load the script and create the provider's bucket.
	if _, err := mustLimiter(b, meter).Admit(ctx, e.job(e.next.Add(1), "warm-up@example.com")); err != nil {
		b.Fatal(err)
	}
	clients := benchClients(b, meter)
	before := benchMemory(b, meter)

	work := redis.NewClient(&redis.Options{Addr: addr, Password: e.rdb.Options().Password, PoolSize: benchWorkers})
	lim := mustLimiter(b, work)
	nowT, err := work.Time(ctx).Result()
	if err != nil {
		b.Fatal(err)
	}
	now := nowT.UnixMicro()
	keys := make([]string, n)
	for lo := 0; lo < n; lo += 1000 {
		p := work.Pipeline()
		for i := lo; i < min(lo+1000, n); i++ {
			keys[i] = quotaKey(e.recipients[i])
			// 6.5, 4 and 1.5 days ago, each up to half a day later per recipient.
			j := int64(i) * (day / 2) / n
			scores := []int64{now - 13*day/2 + j, now - 4*day + j, now - 3*day/2 + j}
			zs := make([]redis.Z, len(scores))
			for k, s := range scores {
				zs[k] = redis.Z{Score: float64(s), Member: benchID(e.next.Add(1))}
			}
			p.ZAdd(ctx, keys[i], zs...)
			// The expiry the engine's last commit set: last entry + longest window.
			p.PExpireAt(ctx, keys[i], time.UnixMicro(scores[2]+7*day))
		}
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}

	// One real admission per recipient: all must be denied by 3 per 168h.
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				d, err := lim.Admit(ctx, e.job(e.next.Add(1), e.recipients[i]))
				if err == nil && (d.Allowed() || d.TakeIndex != 0 || d.Limit != "3 per 168h") {
					err = fmt.Errorf("%s: allowed %v, take %d, limit %q, want denied by 3 per 168h", e.recipients[i], d.Allowed(), d.TakeIndex, d.Limit)
				}
				if err != nil {
					mu.Lock()
					bad = append(bad, err.Error())
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		b.Fatalf("%d of %d steady-state admissions were not denied by the weekly window, e.g. %s", len(bad), n, bad[0])
	}
	_ = work.Close()
	for deadline := time.Now().Add(5 * time.Second); benchClients(b, meter) != clients; {
		if time.Now().After(deadline) {
			b.Fatalf("the server still has %d clients, want %d", benchClients(b, meter), clients)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := benchMemory(b, meter)
	if got := meter.Exists(ctx, keys...).Val(); got != n {
		b.Fatalf("%d of %d quota keys exist", got, n)
	}
	if after.keys > before.keys+n { // fewer when the bucket's state has expired
		b.Fatalf("%d keys, want at most %d: the denied admissions wrote keys", after.keys, before.keys+n)
	}
	if c := meter.ZCard(ctx, keys[n/2]).Val(); c != 3 {
		b.Fatalf("%s holds %d entries after the admissions, want 3", keys[n/2], c)
	}
	usage, err := meter.MemoryUsage(ctx, keys[n/2], 0).Result()
	if err != nil {
		b.Fatal(err)
	}
	enc := meter.ObjectEncoding(ctx, keys[n/2]).Val()
	perRecipient := float64(after.used-before.used) / n

	logged := false
	b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
		if !logged { // the output of every run of a sub-benchmark is printed
			logged = true
			b.Logf("quota key %s: %s, %d bytes (MEMORY USAGE); used_memory %d -> %d (clients' part %d -> %d)",
				keys[n/2], enc, usage, before.used, after.used, before.clients, after.clients)
		}
		benchParallel(b, benchWorkers, func(ctx context.Context) (int64, int64, error) {
			k := e.next.Add(1)
			d, err := e.lim.Admit(ctx, e.job(k, e.cycling(k)))
			if err == nil && d.Allowed() {
				err = errors.New("a steady-state recipient was admitted")
			}
			return 1, 0, err
		})
		b.ReportMetric(float64(usage), "bytes/key")
		b.ReportMetric(perRecipient, "bytes/recipient")
	})
}

// benchClients returns INFO clients connected_clients.
func benchClients(b *testing.B, rdb *redis.Client) int {
	b.Helper()
	info, err := rdb.Info(context.Background(), "clients").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("INFO clients has no connected_clients")
	return 0
}

// benchMem is what MEMORY STATS says: used_memory, the part of it that is
// client buffers and structures, and the number of keys.
type benchMem struct{ used, clients, keys int64 }

func benchMemory(b *testing.B, rdb *redis.Client) benchMem {
	b.Helper()
	v, err := rdb.Do(context.Background(), "MEMORY", "STATS").Result()
	if err != nil {
		b.Fatal(err)
	}
	fields := map[string]any{}
	switch v := v.(type) {
	case map[any]any: // RESP3
		for k, x := range v {
			fields[fmt.Sprint(k)] = x
		}
	case []any: // RESP2
		for i := 0; i+1 < len(v); i += 2 {
			fields[fmt.Sprint(v[i])] = v[i+1]
		}
	}
	get := func(name string) int64 {
		x, ok := fields[name].(int64)
		if !ok {
			b.Fatalf("MEMORY STATS: no integer %s in %v", name, v)
		}
		return x
	}
	return benchMem{used: get("total.allocated"), clients: get("clients.normal"), keys: get("keys.count")}
}

// BenchmarkBucket measures bucket-only admissions of a provider's bucket:
// Admit on a bucket that never runs dry, and Reserve (max wait 1s) on one of
// 5000/s burst 100 that the callers outrun, so admissions are reserved ahead
// until the wait would pass 1s and are denied beyond.
func BenchmarkBucket(b *testing.B) {
	e := newBenchEnv(b)
	tight := mustBucket(b, "tight", 5000, 100)
	b.Run("admit", func(b *testing.B) {
		benchParallel(b, benchWorkers, func(ctx context.Context) (int64, int64, error) {
			n := e.next.Add(1)
			d, err := e.lim.Admit(ctx, throttle.Request{ID: benchID(n), Takes: []throttle.Take{{Rule: e.bucket, Subject: benchProvider}}})
			return 1, benchB2I(d.Allowed()), err
		})
	})
	b.Run("reserve", func(b *testing.B) {
		var delayed atomic.Int64
		benchParallel(b, benchWorkers, func(ctx context.Context) (int64, int64, error) {
			n := e.next.Add(1)
			d, err := e.lim.Admit(ctx, withWait(throttle.Request{ID: benchID(n), Takes: []throttle.Take{{Rule: tight, Subject: benchProvider}}}, time.Second))
			if d.Allowed() && d.Delay > 0 {
				delayed.Add(1)
			}
			return 1, benchB2I(d.Allowed()), err
		})
		b.ReportMetric(100*float64(delayed.Load())/math.Max(1, float64(b.N)), "%delayed")
	})
}

// withWait returns r with MaxWait w: a bucket short of tokens for at most w
// reserves ahead.
func withWait(r throttle.Request, w time.Duration) throttle.Request {
	r.MaxWait = w
	return r
}
