package pipeline

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

var (
	bareTasks  = flag.Int("bare.tasks", 5000, "jobs per drain in BenchmarkWorkerVsBare")
	bareRounds = flag.Int("bare.rounds", 3, "rounds of BenchmarkWorkerVsBare, each draining every variant twice (ABBA)")
	bareOff    = flag.Bool("bare.nodead", false, "also run \"worker, dead_after 0\" in BenchmarkWorkerVsBare: the worker with the hand-over of dead workers' tasks off")
	bareFloor  = flag.Bool("bare.floor", true, "also run \"floor\" in BenchmarkWorkerVsBare: the bare worker plus the least any throttler must send per task (a script call before the POST through the auto-pipeliner, a SET after it), as the worker sends them")
	bareQueues = flag.String("bare.queues", "critical:6,default:3,low:1", "worker.queues of both variants of BenchmarkWorkerVsBare, name:weight comma-separated (config.yaml's; the jobs go to default)")
)

// bareConcurrency and bareProcs are the fleet of each variant of
// BenchmarkWorkerVsBare: config.yaml's concurrency, two processes.
const (
	bareConcurrency = 20
	bareProcs       = 2
	bareTarget      = 0.85 // worker/bare
	bareCmdsTarget  = 28.0 // Redis commands per task, the worker's
)

// blackboxConfig is the worker's config in BenchmarkWorkerVsBare:
// config.yaml's worker settings (booking, sent markers, the hand-over of
// dead workers' tasks after dead_after) and a provider that never binds.
const blackboxConfig = `redis:
  url: redis://%s/0
worker:
  concurrency: %d
  queues: {%s}
  shutdown_timeout: 10s
  poll_interval: 100ms
  http_addr: %q
  inline_wait: 2.5s
  book: true
  book_ahead: 5s
  priority_queues: [%s]
  jitter: 1s
  sent_marks: 1h
  remember_takes: 2s
  window_margin: 250ms
  dead_after: %s
policies:
  marketing:
    - {limit: 1, per: 24h}
    - {limit: 3, per: 168h}
providers:
  hook: {type: webhook, url: %q, timeout: 5s, rate: 1000000, burst: 1000000}
defaults: {policy: marketing, provider: hook, queue: default}
`

// bareVariant is one contender of BenchmarkWorkerVsBare: how to start one
// of its processes.
type bareVariant struct {
	name  string
	start func(b *testing.B, n int) *workerProc
}

// BenchmarkWorkerVsBare is the black-box measure of what the throttler
// costs where nothing is throttled: the built cmd/worker (2 processes of
// concurrency 20, config.yaml's worker settings, recovery of dead workers
// included) against a bare asynq worker doing the same POST
// (tools/bench/bareworker, 2 processes, the same asynq settings), on one
// redis-server, delivering to the same local webhook. Every job has a
// recipient of its own and the provider does not bind, so every job goes at
// once.
//
// A drain enqueues -bare.tasks jobs onto the paused default queue, starts
// the variant's processes and waits until they are healthy, then unpauses
// the queue and times until the webhook has every message and the queue is
// empty; Redis commands (INFO commandstats, commands run inside scripts
// included) are counted over the same span, so that start-up and shut-down
// are not. Each of -bare.rounds rounds drains every variant twice in ABBA
// order. Reported: worker/bare (all tasks over all drain time; target >=
// 0.85), median_ratio (the median of the rounds' ratios), and Redis
// commands per task of each (target for the worker <= 28); the log has each
// variant's commands per task by command, the worker's cost where it
// differs from the bare worker's. With -bare.floor (on by default) a third contender,
// "floor", is the bare worker plus the least any throttler must send per
// task (see tools/bench/bareworker): its ratio is the ceiling of the
// worker's on the machine the benchmark runs on.
func BenchmarkWorkerVsBare(b *testing.B) {
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	f := newBookFleet(b, buildWorker(b, root))
	bare := buildBare(b, root)
	vs := []*bareVariant{
		{name: "worker", start: func(b *testing.B, n int) *workerProc { return startBlackbox(b, f, n, "5s") }},
		{name: "bare", start: func(b *testing.B, n int) *workerProc { return startBare(b, bare, n, f) }},
	}
	if *bareFloor {
		vs = append(vs, &bareVariant{name: "floor", start: func(b *testing.B, n int) *workerProc { return startBare(b, bare, n, f, "-floor") }})
	}
	if *bareOff {
		vs = append(vs, &bareVariant{name: "worker, dead_after 0", start: func(b *testing.B, n int) *workerProc { return startBlackbox(b, f, n, "0s") }})
	}
	for _, v := range vs {
		bareDrain(b, f, v, 500) // warm-up
	}
	total := map[*bareVariant]e2eTotal{}
	stats := map[*bareVariant]map[string]float64{}
	ratios := map[*bareVariant][]float64{}
	for range *bareRounds {
		back := slices.Clone(vs)
		slices.Reverse(back)
		round := map[*bareVariant]e2eTotal{}
		for _, v := range append(slices.Clone(vs), back...) {
			d, cost, byCmd := bareDrain(b, f, v, *bareTasks)
			t := round[v]
			t.tasks, t.elapsed, t.cost = t.tasks+*bareTasks, t.elapsed+d, t.cost.plus(cost)
			round[v] = t
			stats[v] = addStats(stats[v], byCmd)
		}
		for _, v := range vs {
			t := total[v]
			t.tasks, t.elapsed, t.cost = t.tasks+round[v].tasks, t.elapsed+round[v].elapsed, t.cost.plus(round[v].cost)
			total[v] = t
			ratios[v] = append(ratios[v], round[v].rate()/round[vs[1]].rate())
		}
	}
	w, p := total[vs[0]], total[vs[1]]
	for _, v := range vs {
		t := total[v]
		b.Logf("%s: %.0f tasks/s, %.3f of bare (rounds %s, median %.3f); per task: %s",
			v.name, t.rate(), t.rate()/p.rate(), formatRatios(ratios[v]), median(ratios[v]), t.cost.per(t.tasks))
	}
	for _, v := range vs {
		b.Logf("%s, Redis commands per task by command: %s", v.name, formatStats(stats[v], float64(total[v].tasks), stats[vs[1]], float64(p.tasks)))
	}
	ratio, cmds := w.rate()/p.rate(), w.cost.calls/float64(w.tasks)
	b.Logf("worker/bare %.3f, median of rounds %.3f; target >= %.2f (by both): %s. Redis commands per task %.1f (bare %.1f); target <= %.0f: %s",
		ratio, median(ratios[vs[0]]), bareTarget, verdict(min(ratio, median(ratios[vs[0]])) >= bareTarget),
		cmds, p.cost.calls/float64(p.tasks), bareCmdsTarget, verdict(cmds <= bareCmdsTarget))
	b.ReportMetric(ratio, "worker/bare")
	b.ReportMetric(median(ratios[vs[0]]), "median_ratio")
	b.ReportMetric(cmds, "worker_cmds/task")
	b.ReportMetric(p.cost.calls/float64(p.tasks), "bare_cmds/task")
	for _, v := range vs[2:] {
		t, unit := total[v], map[string]string{"floor": "floor", "worker, dead_after 0": "nodead"}[v.name]
		b.ReportMetric(t.rate()/p.rate(), unit+"/bare")
		b.ReportMetric(median(ratios[v]), unit+"_median_ratio")
		b.ReportMetric(t.cost.calls/float64(t.tasks), unit+"_cmds/task")
	}
	b.ReportMetric(1e9/w.rate(), "ns/op")
}

// bareDrain drains n jobs with v's processes and returns the time from the
// queue's unpause until it was empty, what it cost, and the Redis commands
// run meanwhile by command.
func bareDrain(b *testing.B, f *bookFleet, v *bareVariant, n int) (time.Duration, e2eCost, map[string]float64) {
	b.Helper()
	ctx := context.Background()
	ids, err := enqueueJobs(ctx, f.client, n, fmt.Sprintf("%s-%d-", strings.ReplaceAll(v.name, " ", ""), time.Now().UnixNano()))
	if err != nil {
		b.Fatal(err)
	}
	// Each with its accepted event, as the enqueue command and the API
	// record it: the history the worker's events are then pushed on.
	accepted := make([]lifecycle.Event, len(ids))
	for i, id := range ids {
		accepted[i] = lifecycle.Event{Type: lifecycle.Accepted, Message: id, Via: lifecycle.ViaEnqueue}
	}
	for part := range slices.Chunk(accepted, 500) {
		if err := lifecycle.NewRecorder(f.admin, lifecycle.Options{}).Record(ctx, part...); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.insp.PauseQueue(benchQueue); err != nil {
		b.Fatal(err)
	}
	var ws []*workerProc
	for i := range bareProcs {
		ws = append(ws, v.start(b, i))
	}
	for _, w := range ws {
		w.awaitHealthy(b)
	}
	done := f.hook.expect(n)
	c0, s0 := readCostByCmd(b, f)
	start := time.Now()
	if err := f.insp.UnpauseQueue(benchQueue); err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%s: not drained after 2m\n%s", v.name, workerLogs(ws))
	}
	end, err := awaitEmpty(f.insp, 30*time.Second)
	if err != nil {
		b.Fatalf("%s: %v\n%s", v.name, err, workerLogs(ws))
	}
	c1, s1 := readCostByCmd(b, f)
	for _, w := range ws {
		if err := w.stop(); err != nil {
			b.Fatalf("%s %d: %v\n%s", v.name, w.n, err, w.logTail())
		}
	}
	if distinct, total, _ := f.hook.arrivals(); distinct != n || total != n {
		b.Fatalf("%s: the webhook got %d messages (%d distinct), want %d once each", v.name, total, distinct, n)
	}
	return end.Sub(start), c1.minus(c0), addStats(s1, scaleStats(s0, -1))
}

// readCostByCmd is readCost and INFO commandstats' calls by command.
func readCostByCmd(b *testing.B, f *bookFleet) (e2eCost, map[string]float64) {
	b.Helper()
	c, err := readCost(context.Background(), f.admin)
	if err != nil {
		b.Fatal(err)
	}
	info, err := f.admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	byCmd := map[string]float64{}
	for _, line := range strings.Split(info, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if cmd, isCmd := strings.CutPrefix(name, "cmdstat_"); ok && isCmd {
			byCmd[cmd] = statField(val, "calls")
		}
	}
	return c, byCmd
}

func addStats(a, d map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range a {
		out[k] += v
	}
	for k, v := range d {
		out[k] += v
	}
	return out
}

func scaleStats(a map[string]float64, k float64) map[string]float64 {
	out := map[string]float64{}
	for c, v := range a {
		out[c] = k * v
	}
	return out
}

// formatStats lists the commands per task of s (over n tasks), most first,
// each with the baseline's (base over bn tasks) where it has them.
func formatStats(s map[string]float64, n float64, base map[string]float64, bn float64) string {
	var cmds []string
	for c, v := range s {
		if v/n >= 0.05 || base[c]/bn >= 0.05 {
			cmds = append(cmds, c)
		}
	}
	sort.Slice(cmds, func(i, j int) bool { return s[cmds[i]] > s[cmds[j]] })
	parts := make([]string, len(cmds))
	for i, c := range cmds {
		parts[i] = fmt.Sprintf("%s %.2f (bare %.2f)", c, s[c]/n, base[c]/bn)
	}
	return strings.Join(parts, ", ")
}

// startBlackbox starts worker n of the fleet with blackboxConfig and
// worker.dead_after deadAfter.
func startBlackbox(b *testing.B, f *bookFleet, n int, deadAfter string) *workerProc {
	return startWorkerWith(b, f.bin, n, func(metrics string) string {
		queues := strings.ReplaceAll(strings.ReplaceAll(*bareQueues, ":", ": "), ",", ", ")
		priority := ""
		if strings.Contains(","+*bareQueues, ",critical:") {
			priority = "critical"
		}
		return fmt.Sprintf(blackboxConfig, f.srv.Addr, bareConcurrency, queues, metrics, priority, deadAfter, f.hook.URL())
	})
}

// buildBare builds tools/bench/bareworker into a temp dir.
func buildBare(b *testing.B, root string) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "bareworker")
	cmd := exec.Command("go", "build", "-o", bin, "./bench/bareworker")
	cmd.Dir = filepath.Join(root, "tools")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build ./bench/bareworker: %v\n%s", err, out)
	}
	return bin
}

// startBare starts bare worker n on the fleet's Redis and webhook, with
// extra flags.
func startBare(b *testing.B, bin string, n int, f *bookFleet, extra ...string) *workerProc {
	b.Helper()
	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	args := append([]string{"-redis", f.srv.Addr, "-url", f.hook.URL(),
		"-http", addr, "-concurrency", fmt.Sprint(bareConcurrency), "-queues", *bareQueues}, extra...)
	return startProc(b, n, addr, exec.Command(bin, args...))
}
