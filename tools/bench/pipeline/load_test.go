package pipeline

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
)

var (
	loadJobs        = flag.Int("load.jobs", 50000, "notifications in BenchmarkLoad")
	loadRecipients  = flag.Int("load.recipients", 5000, "distinct recipients in BenchmarkLoad")
	loadWorkers     = flag.Int("load.workers", 4, "worker processes in BenchmarkLoad")
	loadConcurrency = flag.Int("load.concurrency", 20, "worker.concurrency of each worker process in BenchmarkLoad")
)

const (
	loadRate  = 5000 // provider bucket, messages/s: large, so the run measures the pipeline
	loadBurst = 500
	// The recipient policy: generous (a recipient gets jobs/recipients = 10
	// messages in all), with a 1 s window that binds now and then because
	// the lines are shuffled: a recipient whose messages come up close
	// together is deferred, so the recipient check below has something to
	// check.
	loadPolicy    = "[{limit: 20, per: 1m}, {limit: 3, per: 1s}]"
	loadTimeout   = 5 * time.Minute
	loadTolerance = 200 * time.Millisecond // arrival jitter allowed against a window
)

// loadWindows is loadPolicy for the arrival check.
var loadWindows = []struct {
	limit int
	per   time.Duration
}{{20, time.Minute}, {3, time.Second}}

// loadConfig is the config of the workers and of enqueue.
const loadConfig = `redis:
  url: redis://%s/0
worker:
  concurrency: %d
  queues: {default: 1}
  shutdown_timeout: 10s
  http_addr: %q
  inline_wait: 1s
  jitter: 1s
policies:
  load: %s
providers:
  hook: {type: webhook, url: %q, timeout: 5s, rate: %d, burst: %d}
defaults: {policy: load, provider: hook, queue: default}
`

// BenchmarkLoad is the load run: 50k notifications to 5k
// recipients (10 each, the lines shuffled with a fixed seed), written as a
// JSONL file and enqueued by the enqueue binary, then drained by 4 worker
// processes (concurrency 20 each) sharing one redis-server, through a
// provider of 5000/s burst 500 that hardly paces, under a policy of 20 per
// minute and 3 per second per recipient. Reported:
//
//   - enqueue_lines/s: the enqueue binary's rate on the file;
//   - delivered/s: (messages - 1) / (last arrival - first arrival);
//   - p50_ms, p90_ms, p99_ms: admission latency, from the workers'
//     throttler_admission_seconds buckets summed over the workers
//     (interpolated within a bucket, as histogram_quantile does);
//   - redis_cpu_us/msg: INFO cpu (used_cpu_sys + used_cpu_user) over the
//     drain, per message delivered; the total is logged;
//   - deferred/msg: deferrals (the 1 s window) per message.
//
// It fails on a broken invariant: a message lost or delivered twice, a task
// left in retry or archived, a recipient over a window of its policy (by
// the webhook's arrival times, allowing 200 ms of delivery jitter), more
// tokens out of the provider's bucket in 1 s of Redis time than rate +
// burst (its ledger), a worker that delivered nothing or did not stop
// cleanly. Sizes: -load.jobs, -load.recipients, -load.workers,
// -load.concurrency.
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	n, recipients := *loadJobs, *loadRecipients
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	workerBin := buildWorker(b, root)
	enqueueBin := buildCommand(b, root, "enqueue")
	srv := redistest.Start(b)
	admin := srv.Client(b)
	hook := newWebhook(b)
	dir := b.TempDir()

	// The file: line i goes to recipient perm[i] % recipients.
	rnd := rand.New(rand.NewPCG(5, 5))
	perm := rnd.Perm(n)
	file := filepath.Join(dir, "load.jsonl")
	ids := make([]string, n)
	recipientOf := make(map[string]string, n)
	{
		fh, err := os.Create(file)
		if err != nil {
			b.Fatal(err)
		}
		w := bufio.NewWriter(fh)
		for i := range n {
			key := fmt.Sprintf("load-%06d", i)
			rcpt := fmt.Sprintf("r%05d@example.com", perm[i]%recipients)
			ids[i] = message.TaskID(key)
			recipientOf[ids[i]] = rcpt
			fmt.Fprintf(w, `{"recipient":%q,"template":%q,"data":{"n":%d},"idempotency_key":%q}`+"\n", rcpt, benchTemplate, i, key)
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
		fh.Close()
	}
	conf := filepath.Join(dir, "enqueue.yaml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, loadConfig, srv.Addr, *loadConcurrency, "", loadPolicy, hook.URL(), loadRate, loadBurst), 0o644); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	enq := exec.Command(enqueueBin, "-config", conf, "-file", file)
	enq.Env = envWithoutRedisURL()
	out, err := enq.CombinedOutput()
	enqTime := time.Since(start)
	want := fmt.Sprintf("enqueued %d, duplicates 0, rejected 0 (%d lines)", n, n)
	if err != nil || !strings.Contains(string(out), want) {
		b.Fatalf("enqueue -file: %v, output:\n%s\nwant %q", err, tailLines(string(out), 10), want)
	}
	enqRate := float64(n) / enqTime.Seconds()
	b.Logf("enqueue -file: %d lines in %s: %.0f lines/s", n, enqTime.Round(time.Millisecond), enqRate)

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if q, err := insp.GetQueueInfo(benchQueue); err != nil || q.Pending != n {
		b.Fatalf("after enqueue: queue %+v (%v), want %d pending", q, err, n)
	}

	done := hook.expect(n)
	c0, err := readCost(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	ws := make([]*workerProc, *loadWorkers)
	for i := range ws {
		ws[i] = startLoadWorker(b, workerBin, i, srv.Addr, hook.URL())
	}
	for _, w := range ws {
		w.awaitHealthy(b)
	}
	select {
	case <-done:
	case <-time.After(loadTimeout):
		distinct, _, _ := hook.arrivals()
		b.Fatalf("%d of %d delivered after %s; worker logs:\n%s", distinct, n, loadTimeout, workerLogs(ws))
	}
	c1, err := readCost(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := awaitEmpty(insp, 30*time.Second); err != nil {
		b.Fatalf("%v; worker logs:\n%s", err, workerLogs(ws))
	}

	// Metrics, before the workers stop.
	hist := map[float64]float64{} // le -> cumulative count, summed over workers
	var count, sent, deferred float64
	for _, w := range ws {
		series, err := scrapeSeries(w.metrics)
		if err != nil {
			b.Fatalf("worker %d: %v", w.n, err)
		}
		var s, d float64
		for k, v := range series {
			switch {
			case strings.HasPrefix(k, "throttler_admission_seconds_bucket{"):
				le, err := labelValue(k, "le")
				if err != nil {
					b.Fatalf("worker %d: %s: %v", w.n, k, err)
				}
				hist[le] += v
			case k == "throttler_admission_seconds_count":
				count += v
			case strings.HasPrefix(k, "throttler_sent_total"):
				s += v
			case strings.HasPrefix(k, "throttler_deferred_total"):
				d += v
			}
		}
		b.Logf("worker %d: sent %.0f, deferred %.0f", w.n, s, d)
		if s == 0 {
			b.Fatalf("worker %d delivered nothing: not a %d-process run", w.n, len(ws))
		}
		sent += s
		deferred += d
	}
	for _, w := range ws {
		if err := w.stop(); err != nil {
			b.Fatalf("worker %d: %v\n%s", w.n, err, w.logTail())
		}
	}

	// Each task delivered exactly once.
	distinct, total, times := hook.arrivals()
	if distinct != n || total != n || sent != float64(n) {
		b.Fatalf("the webhook got %d messages (%d distinct) and the workers counted %.0f sent, want %d once each",
			total, distinct, sent, n)
	}
	first := hook.firstArrivals()
	for _, id := range ids {
		if _, ok := first[id]; !ok {
			b.Fatalf("task %s was enqueued and never delivered", id)
		}
	}
	if q, err := insp.GetQueueInfo(benchQueue); err != nil || q.Completed != n || q.Archived+q.Retry != 0 {
		b.Fatalf("queue at the end: %+v (%v), want %d completed and nothing archived or in retry", q, err, n)
	}

	// No recipient over a window of its policy, by arrival times.
	byRecipient := map[string][]time.Time{}
	for id, at := range first {
		byRecipient[recipientOf[id]] = append(byRecipient[recipientOf[id]], at)
	}
	tightest := time.Duration(math.MaxInt64) // smallest span of limit+1 arrivals, 1 s window
	for r, at := range byRecipient {
		slices.SortFunc(at, time.Time.Compare)
		for _, win := range loadWindows {
			for i := 0; i+win.limit < len(at); i++ {
				span := at[i+win.limit].Sub(at[i])
				if win.per == time.Second {
					tightest = min(tightest, span)
				}
				if span < win.per-loadTolerance {
					b.Fatalf("recipient %s: %d messages arrived within %s, policy allows %d per %s (tolerance %s)",
						r, win.limit+1, span, win.limit, win.per, loadTolerance)
				}
			}
		}
	}
	if deferred == 0 {
		b.Logf("no deferral: the 1 s window never bound, the recipient check checked nothing")
	} else {
		b.Logf("%.0f deferrals; the closest %d+1 messages to one recipient arrived %s apart (window 1 s)",
			deferred, loadWindows[1].limit, tightest.Round(time.Millisecond))
	}

	// The provider's bucket: at most rate + burst tokens in any 1 s of Redis time.
	moments, err := ledgerMoments(ctx, admin, benchProvider, n)
	if err != nil {
		b.Fatalf("the provider's ledger: %v", err)
	}
	var tok []time.Time
	for _, m := range moments {
		tok = append(tok, m)
	}
	slices.SortFunc(tok, time.Time.Compare)
	most := newPacing(tok, tok[0]).maxWindow(time.Second)
	if most > loadRate+loadBurst {
		b.Fatalf("the bucket gave out %d tokens within 1 s, more than rate + burst (%d)", most, loadRate+loadBurst)
	}

	p := newPacing(times, times[0])
	rate := p.rate()
	cost := c1.minus(c0)
	p50, p90, p99 := quantile(hist, count, 0.5), quantile(hist, count, 0.9), quantile(hist, count, 0.99)
	b.Logf("%d messages, %d recipients, %d workers x %d: drained in %s, %.0f delivered/s; most tokens in 1 s %d (<= %d)",
		n, recipients, len(ws), *loadConcurrency, p.span().Round(time.Millisecond), rate, most, loadRate+loadBurst)
	b.Logf("admission calls %.0f (%.3f per message), latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms",
		count, count/float64(n), 1e3*p50, 1e3*p90, 1e3*p99)
	b.Logf("Redis over the drain: CPU %.2f s (%.0f µs per message), %.1f commands and %.1f script calls per message",
		cost.redisCPU, 1e6*cost.redisCPU/float64(n), cost.calls/float64(n), cost.scripts/float64(n))

	b.ReportMetric(enqRate, "enqueue_lines/s")
	b.ReportMetric(rate, "delivered/s")
	b.ReportMetric(1e3*p50, "p50_ms")
	b.ReportMetric(1e3*p90, "p90_ms")
	b.ReportMetric(1e3*p99, "p99_ms")
	b.ReportMetric(1e6*cost.redisCPU/float64(n), "redis_cpu_us/msg")
	b.ReportMetric(deferred/float64(n), "deferred/msg")
	b.ReportMetric(float64(p.span().Nanoseconds())/float64(n), "ns/op")
	b.ReportMetric(0, "B/op")
	b.ReportMetric(0, "allocs/op")
}

// startLoadWorker starts worker n with the load config.
func startLoadWorker(b *testing.B, bin string, n int, redisAddr, url string) *workerProc {
	return startWorkerWith(b, bin, n, func(metrics string) string {
		return fmt.Sprintf(loadConfig, redisAddr, *loadConcurrency, metrics, loadPolicy, url, loadRate, loadBurst)
	})
}

// buildCommand builds ./cmd/<name> into a temp dir.
func buildCommand(b *testing.B, root, name string) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	return bin
}

// envWithoutRedisURL is this environment without REDIS_URL, which would
// replace the config's redis.url.
func envWithoutRedisURL() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "REDIS_URL=") })
}

// scrapeSeries reads /metrics and returns each series by "name{labels}".
func scrapeSeries(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics: %q: %v", line, err)
		}
		m[line[:sp]] += v
	}
	return m, sc.Err()
}

// labelValue returns the value of label name in `name{a="x",le="0.1"}` as a float.
func labelValue(series, name string) (float64, error) {
	i := strings.Index(series, name+`="`)
	if i < 0 {
		return 0, fmt.Errorf("no label %s", name)
	}
	v := series[i+len(name)+2:]
	v = v[:strings.IndexByte(v, '"')]
	return strconv.ParseFloat(v, 64) // "+Inf" parses as +Inf
}

// quantile estimates the q-quantile of a histogram given as cumulative
// counts by upper bound, interpolating linearly within the bucket it falls
// in (0 is the lower bound of the first). In the +Inf bucket it returns the
// largest finite bound.
func quantile(cum map[float64]float64, count, q float64) float64 {
	les := make([]float64, 0, len(cum))
	for le := range cum {
		les = append(les, le)
	}
	sort.Float64s(les)
	if count == 0 || len(les) == 0 {
		return math.NaN()
	}
	rank := q * count
	lower, below := 0.0, 0.0
	for _, le := range les {
		c := cum[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return lower
			}
			if c == below {
				return le
			}
			return lower + (le-lower)*(rank-below)/(c-below)
		}
		lower, below = le, c
	}
	return lower
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func TestQuantile(t *testing.T) {
	// 10 observations: 4 <= 1, 4 in (1, 2], 2 in (2, +Inf).
	cum := map[float64]float64{1: 4, 2: 8, math.Inf(1): 10}
	for _, tt := range []struct{ q, want float64 }{{0.2, 0.5}, {0.4, 1}, {0.6, 1.5}, {0.8, 2}, {0.99, 2}} {
		if got := quantile(cum, 10, tt.q); got != tt.want {
			t.Errorf("quantile %.2f: %v, want %v", tt.q, got, tt.want)
		}
	}
	if v, err := labelValue(`x_bucket{le="0.0008"}`, "le"); err != nil || v != 0.0008 {
		t.Errorf("labelValue: %v, %v", v, err)
	}
}
