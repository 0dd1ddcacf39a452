//go:build integration

package jobs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// Worker clock skew. faketime (libfaketime) cannot skew a Go program: Go
// reads the clock through the vDSO, not libc, so LD_PRELOAD never sees it.
// Instead the test builds this package's test binary with a go build
// -overlay that adds SKEW_SECONDS to time.Now, the one wall-clock source
// of the Go runtime; the monotonic clock, timers and sleeps are untouched,
// as on a host whose wall clock is off. The binary is cached like any
// build, so only the first run pays for recompiling the standard library.

// skewReport is what a skewed child prints, one JSON line after "SKEW ".
type skewReport struct {
	// Offset is the child's time.Now minus Redis TIME, in seconds, as the
	// worker's clock watch measured it and set its gauge.
	Offset float64 `json:"offset"`
	// Warned says the clock watch logged its warning, once over two checks.
	Warned bool `json:"warned"`
	// Decisions are the outcomes of the fixed admission script.
	Decisions []skewDecision `json:"decisions"`
}

type skewDecision struct {
	Allowed bool  `json:"allowed"`
	DelayMS int64 `json:"delay_ms"`
}

// TestWorkerClockSkew runs the same admissions in three processes on one
// Redis, with worker clocks right, 10 minutes fast and 10 minutes slow.
// Their decisions and delays are the same, since the scripts read Redis
// TIME. What the skew does change is asynq's own scheduling, which runs on
// each worker's clock:
//   - a task the handler defers is given a retry time on the deferring
//     worker's clock, 10 minutes late or early in truth;
//   - a worker's task leases are set on its clock too, and a correct
//     worker's recoverer takes a slow worker's leases for long expired: it
//     redelivers a task while the slow worker is still sending it.
//
// The first run builds the standard library again with the overlay (minutes
// on a small machine; cached afterwards), so the test runs in parallel with
// the package's others.
func TestWorkerClockSkew(t *testing.T) {
	t.Parallel()
	bin := buildSkewed(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	insp := asynq.NewInspectorFromRedisClient(rdb)

	skews := []int{0, 600, -600}
	reports := map[int]skewReport{}
	lateBy := map[int]float64{} // the deferred task's retry time minus the quota's

	slowState := map[int]string{} // what became of the slow send
	for _, skew := range skews {
		label := fmt.Sprintf("skew%+d", skew)
		// While the child holds its slow send, a worker with a correct
		// clock starts on the child's queue: its recoverer runs at once.
		// Then the child's send may end.
		during := func() {
			correct := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{label: 1},
				IsFailure: IsFailure, RetryDelayFunc: RetryDelay(0), LogLevel: asynq.FatalLevel})
			if err := correct.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
				t.Fatal(err)
			}
			if skew < 0 {
				awaitState(t, insp, label, label+"-slow", asynq.TaskStateRetry)
			} else {
				// That the recoverer leaves the lease alone is what is
				// checked: it runs at start, and this gives it a second.
				time.Sleep(time.Second)
			}
			correct.Shutdown()
			if err := rdb.Set(context.Background(), label+":release-slow", 1, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
		reports[skew] = runSkewed(t, bin, srv.Addr, skew, label, func() {
			awaitState(t, insp, label, label+"-slow", asynq.TaskStateActive)
			during()
		})
		if info, err := insp.GetTaskInfo(label, label+"-slow"); err == nil {
			slowState[skew] = info.State.String() + " " + info.LastErr
		}
		info, err := insp.GetTaskInfo(label, label+"-second")
		if err != nil {
			t.Fatalf("%s: the deferred task: %v", label, err)
		}
		if info.State != asynq.TaskStateRetry || !strings.HasPrefix(info.LastErr, "throttled by policy mkt") {
			t.Fatalf("%s: second task %s (%q), want it throttled", label, info.State, info.LastErr)
		}
		// The quota frees when the first task's entry, scored in Redis
		// time, is an hour old; RetryDelay adds 1-2s of rounding.
		us, err := rdb.ZScore(context.Background(), label+":{bob}:q:mkt", label+"-first").Result()
		if err != nil {
			t.Fatalf("%s: the first task's quota entry: %v", label, err)
		}
		frees := time.UnixMicro(int64(us)).Add(time.Hour)
		lateBy[skew] = info.NextProcessAt.Sub(frees).Seconds()
	}

	ref := reports[0]
	for _, skew := range skews {
		got := reports[skew]
		if math.Abs(got.Offset-float64(skew)) > 2 {
			t.Fatalf("skew %+ds: the child's clock is %.1fs off Redis's; the skew did not take", skew, got.Offset)
		}
		if got.Warned != (skew != 0) {
			t.Errorf("skew %+ds: the clock watch warned: %t", skew, got.Warned)
		}
		if len(got.Decisions) != len(ref.Decisions) {
			t.Fatalf("skew %+ds: %d decisions, want %d", skew, len(got.Decisions), len(ref.Decisions))
		}
		for i, d := range got.Decisions {
			r := ref.Decisions[i]
			// Delays count down from slightly different moments of each
			// run; a worker's clock would put them 600s off.
			if d.Allowed != r.Allowed || abs(d.DelayMS-r.DelayMS) > 2000 {
				t.Errorf("skew %+ds, decision %d: %+v, unskewed %+v", skew, i, d, r)
			}
		}
		t.Logf("skew %+4ds: clock %+.1fs off Redis, decisions %v, deferred task due %+.0fs after its quota frees; slow send: %s",
			skew, got.Offset, got.Decisions, lateBy[skew], slowState[skew])
		// Only the slow worker's task is taken from it mid-send.
		wantSlow := "completed "
		if skew < 0 {
			wantSlow = "retry " + asynq.ErrLeaseExpired.Error()
		}
		if slowState[skew] != wantSlow {
			t.Errorf("skew %+ds: the slow send ended %q, want %q", skew, slowState[skew], wantSlow)
		}
		// asynq keeps whole seconds, truncated: hence the second before.
		if late := lateBy[skew]; late < float64(skew-1) || late > float64(skew+3) {
			t.Errorf("skew %+ds: the deferred task is due %+.0fs after its quota frees, want %+ds to %+ds (asynq schedules on the worker's clock)",
				skew, late, skew-1, skew+3)
		}
	}
}

func abs(n int64) int64 { return max(n, -n) }

// buildSkewed builds this package's test binary with time.Now shifted by
// $SKEW_SECONDS, and returns its path.
func buildSkewed(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not in PATH: cannot build the skewed worker")
	}
	out, err := exec.Command(goCmd, "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	goroot := strings.TrimSpace(string(out))
	orig := filepath.Join(goroot, "src", "time", "time.go")
	src, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	const line = "\tsec, nsec, mono := runtimeNow()\n"
	if bytes.Count(src, []byte(line)) != 1 {
		t.Fatalf("%s no longer has exactly one %q in Now: update the overlay in skew_test.go", orig, strings.TrimSpace(line))
	}
	dir := t.TempDir()
	patched := filepath.Join(dir, "time.go")
	skewFile := filepath.Join(dir, "skew.go")
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(patched, bytes.Replace(src, []byte(line), []byte(line+"\tsec += skewSeconds\n"), 1))
	write(skewFile, []byte(`package time

import "syscall"

// skewSeconds shifts the wall clock by $SKEW_SECONDS (added by a test overlay).
var skewSeconds = func() int64 {
	v, _ := syscall.Getenv("SKEW_SECONDS")
	n, neg := int64(0), false
	for i, c := range v {
		switch {
		case i == 0 && c == '-':
			neg = true
		case c >= '0' && c <= '9':
			n = n*10 + int64(c-'0')
		default:
			return 0
		}
	}
	if neg {
		return -n
	}
	return n
}()
`))
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {
		orig: patched,
		filepath.Join(goroot, "src", "time", "zz_skew.go"): skewFile,
	}})
	write(filepath.Join(dir, "overlay.json"), overlay)
	bin := filepath.Join(dir, "skewed.test")
	build := exec.Command(goCmd, "test", "-c", "-tags", "integration", "-o", bin, "-overlay", filepath.Join(dir, "overlay.json"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the skewed test binary: %v\n%s", err, out)
	}
	return bin
}

// runSkewed runs the skewed binary's TestSkewChild with the clock off by
// skew seconds, on queue and key prefix label, calls during while it runs,
// and returns its report.
func runSkewed(t *testing.T, bin, addr string, skew int, label string, during func()) skewReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestSkewChild$", "-test.v")
	cmd.Env = append(os.Environ(), "SKEW_SECONDS="+strconv.Itoa(skew), "SKEW_CHILD_ADDR="+addr, "SKEW_CHILD_LABEL="+label)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	during()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("skewed child %s: %v\n%s", label, err, out.Bytes())
	}
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "SKEW "); ok {
			var r skewReport
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatalf("skewed child %s: %v", label, err)
			}
			return r
		}
	}
	t.Fatalf("skewed child %s printed no report:\n%s", label, out.Bytes())
	return skewReport{}
}

// awaitState polls a task until it is in state s.
func awaitState(t *testing.T, insp *asynq.Inspector, queue, id string, s asynq.TaskState) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := insp.GetTaskInfo(queue, id)
		if err == nil && info.State == s {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became %s: %+v, %v", id, s, info, err)
		}
	}
}

// TestSkewChild is the skewed process of TestWorkerClockSkew; it does
// nothing unless run by it (SKEW_CHILD_ADDR set). It admits a fixed script
// of requests under its own key prefix, then runs a worker on its own queue
// that sends one notification and defers a second for the same recipient,
// and then sends a third whose provider answers only once the parent has
// set <label>:release-slow.
func TestSkewChild(t *testing.T) {
	addr := os.Getenv("SKEW_CHILD_ADDR")
	if addr == "" {
		return
	}
	label := os.Getenv("SKEW_CHILD_LABEL")
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var logged bytes.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	watch := &clockWatch{rdb: rdb, m: m, log: slog.New(slog.NewTextHandler(&logged, nil))}
	for range 2 { // the second finds the same offset: no second warning
		if _, ok := watch.check(ctx); !ok {
			t.Fatal("the clock watch measured nothing")
		}
	}
	var gauge dto.Metric
	if err := m.ClockOffset.Write(&gauge); err != nil {
		t.Fatal(err)
	}
	report := skewReport{Offset: gauge.GetGauge().GetValue(), Warned: strings.Count(logged.String(), "clock is off") == 1}
	prefix := label + ":"
	lim, err := throttle.New(rdb, throttle.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 2, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 0.2, 1) // a token every 5s: far more than a busy machine's pause between steps
	quota := func(id string) throttle.Request {
		return throttle.Request{ID: id, Takes: []throttle.Take{{Rule: q, Subject: "alice"}}}
	}
	// The script's bucket is not the worker's provider below (also "gw"):
	// left drained and reserved ahead, it would deny the worker's first
	// send for the 2ms its 1000/s refill takes, and the second task would
	// then go first.
	bucket := func(id string) throttle.Request {
		return throttle.Request{ID: id, Takes: []throttle.Take{{Rule: b, Subject: "script-gw"}}}
	}
	steps := []func() (throttle.Decision, error){
		func() (throttle.Decision, error) { return lim.Admit(ctx, quota("a")) },
		func() (throttle.Decision, error) { return lim.Admit(ctx, quota("b")) },
		func() (throttle.Decision, error) { return lim.Admit(ctx, quota("c")) },                            // denied for ~1h
		func() (throttle.Decision, error) { return lim.Admit(ctx, bucket("x")) },                           // the burst
		func() (throttle.Decision, error) { return lim.Admit(ctx, withWait(bucket("y"), 10*time.Second)) }, // reserved ~5s ahead
		func() (throttle.Decision, error) { return lim.Admit(ctx, bucket("z")) },                           // denied for ~10s
	}
	for _, step := range steps {
		d, err := step()
		if err != nil {
			t.Fatal(err)
		}
		report.Decisions = append(report.Decisions, skewDecision{Allowed: d.Allowed(), DelayMS: d.Delay.Milliseconds()})
	}

	one, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	big, _ := throttle.NewBucket("gw", 1000, 100)
	slowDone := make(chan struct{})
	var slowOnce sync.Once
	th := &Throttle{
		Limiter: lim,
		Rules: Rules{Policies: map[string]*throttle.Quota{"mkt": one}, Providers: map[string]Route{"gw": {Bucket: big, Provider: providers.Func(func(_ context.Context, m providers.Message) (string, error) {
			if strings.HasSuffix(m.ID, "-slow") {
				defer slowOnce.Do(func() { close(slowDone) })
				for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					if rdb.Exists(context.Background(), label+":release-slow").Val() == 1 {
						break
					}
				}
			}
			return "", nil
		})}}},
		Sent: NewSentMarks(lim),
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	srv := startWorker(t, rdb, th, asynq.Config{Concurrency: 1, Queues: map[string]int{label: 1}, LogLevel: asynq.FatalLevel})
	defer srv.Shutdown()
	client := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	for _, id := range []string{label + "-first", label + "-second"} {
		task, err := message.NewTask(message.Notification{Recipient: "bob", Policy: "mkt", Provider: "gw", Template: "t"}, id,
			asynq.Queue(label), asynq.Retention(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task); err != nil {
			t.Fatal(err)
		}
	}
	awaitState(t, insp, label, label+"-second", asynq.TaskStateRetry)
	slow, err := message.NewTask(message.Notification{Recipient: "carol", Policy: "mkt", Provider: "gw", Template: "t"}, label+"-slow",
		asynq.Queue(label), asynq.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(slow); err != nil {
		t.Fatal(err)
	}
	// The slow send ends completed, or, taken from this worker meanwhile,
	// in the retry set: either way not active.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := insp.GetTaskInfo(label, label+"-slow")
		if err == nil && info.State != asynq.TaskStateActive && info.State != asynq.TaskStatePending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow task did not finish: %+v, %v", info, err)
		}
	}
	select { // the send finishes either way
	case <-slowDone:
	case <-time.After(time.Minute):
		t.Fatal("the slow send did not finish")
	}
	line, _ := json.Marshal(report)
	fmt.Printf("SKEW %s\n", line)
}

// withWait returns r with MaxWait w: a bucket short of tokens for at most w
// reserves ahead.
func withWait(r throttle.Request, w time.Duration) throttle.Request {
	r.MaxWait = w
	return r
}
