//go:build integration

package integration_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
)

// TestFleetPausesOn429: three workers drain a backlog through the
// provider's bucket; the webhook answers one request 429 with Retry-After: 6.
// No request reaches the provider for those 6 s (the bucket is drained in
// Redis for the whole fleet), except requests granted a moment before the
// pause reached Redis (bounded by inline_wait), although every worker gets
// fresh jobs during the pause and logs that the provider's bucket held them
// off. Then sending resumes on every worker, the 429-ed job is delivered
// later, and every job exactly once.
func TestFleetPausesOn429(t *testing.T) {
	const (
		backlog    = 200 // one per recipient: only the provider limits them
		rate       = 50
		burst      = 10
		retryAfter = 6 * time.Second
		freshEvery = 20 * time.Millisecond // fresh jobs during the pause
		trigger    = 100                   // the arrival answered 429 (0-based)
		// inline_wait 1s and 3×20 handlers: most waits for the provider's
		// bucket are slept on a reserved token rather than deferred.
		inlineWait = time.Second
		// Requests granted a moment before the pause reached Redis may
		// still arrive after the 429: a reserved token (at most inline_wait
		// ahead) is kept by the pause, and the 429-ed worker reads the
		// answer, releases the quota and pauses the bucket a few ms after
		// the answer. straggle covers both, plus the request-in-flight skew.
		straggle = inlineWait + skewTolerance
	)
	cfg := fleetConfig{
		Concurrency:     20,
		ShutdownTimeout: 5 * time.Second,
		InlineWait:      inlineWait,
		Jitter:          time.Second,
		Policy:          "[{limit: 1, per: 1m}]",
		Rate:            rate,
		Burst:           burst,
	}
	paused := make(chan struct{})
	f := newFleet(t, cfg, func(a arrival, seq int) hookAnswer {
		if seq == trigger {
			close(paused)
			return hookAnswer{Status: 429, RetryAfter: fmt.Sprint(int(retryAfter.Seconds()))}
		}
		return hookAnswer{}
	})
	workers := f.startWorkers("w1", "w2", "w3")

	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	ids := map[string]bool{}
	enqueue := func(i int) {
		ids[f.enqueue(client, fmt.Sprintf("pause-%03d", i), message.Notification{
			Recipient: fmt.Sprintf("user%03d@example.com", i), Template: "news"})] = true
	}
	for i := range backlog {
		enqueue(i)
	}
	// Fresh jobs, one every 20 ms, from when the requests granted before
	// the pause are through until the pause has inline_wait (plus a margin)
	// left: a job taken later waits for its token in the worker rather than
	// being deferred, and shows nothing. An idle worker polls the queue
	// every 0.5-1.5 s (asynq's TaskCheckInterval of 1 s, jittered) and takes
	// what is pending, so in those 3.2 s every worker polls at least twice
	// and finds work it could send at once, but for the bucket: the queue
	// is empty only in the 20 ms after another worker drained it.
	select {
	case <-paused:
	case <-time.After(30 * time.Second):
		t.Fatalf("the webhook never got request %d", trigger)
	}
	freshUntil := time.Now().Add(retryAfter - inlineWait - 300*time.Millisecond)
	time.Sleep(straggle) // the pacing of fresh jobs is the scenario itself
	for i := backlog; time.Now().Before(freshUntil); i++ {
		enqueue(i)
		time.Sleep(freshEvery)
	}
	total := len(ids)
	f.waitSettled(90*time.Second, func(q asynq.QueueInfo) bool { return q.Completed+q.Archived == total })
	m := f.metricsOf(workers...)
	for _, w := range workers {
		f.stop(w)
	}

	arrivals := f.hook.snapshot()
	t.Logf("requests per 250ms from the first: %v", perQuarter(arrivals))
	var hit arrival
	for _, a := range arrivals {
		if a.Status == 429 {
			if hit.Key != "" {
				t.Fatalf("two requests answered 429: %s and %s", hit.Key, a.Key)
			}
			hit = a
		}
	}
	if hit.Key == "" {
		t.Fatalf("no request was answered 429 (%d arrivals)", len(arrivals))
	}
	t429 := hit.Answered
	quietFrom, quietTo := t429.Add(straggle), t429.Add(retryAfter-clockSlop)
	before, after := map[string]int{}, map[string]int{}
	stragglers, quiet := 0, 0
	for _, a := range arrivals {
		switch {
		case a.At.Before(t429):
			before[a.Worker]++
		case a.At.Before(quietFrom):
			stragglers++
		case a.At.Before(quietTo):
			quiet++
			t.Errorf("request %s from worker %s arrived %s after the 429, during the pause", a.Key, a.Worker, a.At.Sub(t429))
		default:
			after[a.Worker]++
		}
	}
	t.Logf("before the 429: %v; stragglers within %s: %d; during the rest of the pause: %d; after it: %v",
		before, straggle, stragglers, quiet, after)
	// Every worker had work during the pause (the fresh jobs at least) and
	// was held off: it logged deferrals by the provider's bucket then.
	// Without the pause the bucket would have had tokens: nothing can have
	// been granted after the stragglers' moments.
	heldOff := map[string]int{}
	for _, w := range workers {
		for _, d := range deferrals(t, w) {
			if !d.at.Before(quietFrom) && d.at.Before(quietTo) && strings.HasPrefix(d.reason, "throttled by provider "+fleetProvider) {
				heldOff[w.name]++
			}
		}
	}
	t.Logf("deferrals by the provider bucket during the pause: %v", heldOff)
	for _, w := range workers {
		if before[w.name] == 0 {
			t.Errorf("worker %s sent nothing before the 429", w.name)
		}
		if heldOff[w.name] == 0 {
			t.Errorf("worker %s was not held off by the provider during the pause: it had no work then, the test shows nothing for it", w.name)
		}
		if after[w.name] == 0 {
			t.Errorf("worker %s sent nothing after the pause", w.name)
		}
	}

	// The 429-ed job: deferred, then delivered once, after the pause.
	var retried []arrival
	for _, a := range arrivals {
		if a.Key == hit.Key {
			retried = append(retried, a)
		}
	}
	if len(retried) != 2 || retried[1].Status != 200 || retried[1].At.Before(t429.Add(retryAfter)) {
		t.Errorf("the 429-ed job %s arrived %d times (%+v), want once more with 200 after the pause", hit.Key, len(retried), retried)
	}

	// Every job delivered exactly once.
	got := f.hook.delivered()
	for id := range ids {
		if got[id] != 1 {
			t.Errorf("task %s delivered %d times, want 1", id, got[id])
		}
	}
	if len(got) != total {
		t.Errorf("%d distinct tasks delivered, want %d", len(got), total)
	}
	if a := f.archived(); len(a) != 0 {
		t.Errorf("%d tasks archived, want none: %v", len(a), a)
	}

	// The provider's bucket, with the pause: exactly on the granted moments
	// (the 429-ed job's first token was forgotten, its retry took a new
	// one after the pause), within the skew on arrivals.
	ledger := f.ledger()
	var granted, arrived []time.Time
	for _, g := range ledger {
		granted = append(granted, g)
	}
	var skews []time.Duration
	for _, a := range arrivals {
		arrived = append(arrived, a.At)
		g, ok := ledger[a.Key]
		if !ok {
			t.Errorf("task %s arrived but holds no token of the bucket", a.Key)
			continue
		}
		if a.Key == hit.Key && a.Status == 429 {
			continue // its token was forgotten: the ledger holds the retry's
		}
		if a.At.Before(g.Add(-clockSlop)) {
			t.Errorf("task %s arrived %s before its granted moment", a.Key, g.Sub(a.At))
		}
		skews = append(skews, a.At.Sub(g))
	}
	excessGranted := checkBucket(t, "granted moments", granted, rate, burst, grantResolution, nil)
	excessArrived := checkBucket(t, "arrivals", arrived, rate, burst, skewTolerance, nil)
	t.Logf("arrivals %d, most in any 1s: %d (the bucket allows %d); excess over the bucket: granted %.2f, arrived %.2f; arrival-granted skew: %s",
		len(arrivals), maxRate(arrived, time.Second), burst+rate, excessGranted, excessArrived, skewSummary(skews))

	for name, want := range map[string]float64{
		`throttler_paused_total{provider="hook"}`: 1,
		`throttler_sent_total{provider="hook"}`:   float64(total),
		`throttler_failed_total{provider="hook"}`: 1,
	} {
		if m[name] != want {
			t.Errorf("metrics: %s = %g, want %g", name, m[name], want)
		}
	}
}

// workerDeferral is one "deferred" line of a worker's log.
type workerDeferral struct {
	at     time.Time
	reason string
}

// deferralLine matches the worker's log line for a deferred job (slog text).
var deferralLine = regexp.MustCompile(`^time=(\S+) level=INFO msg=deferred task=\S+ reason="([^"]*)"`)

// deferrals returns the deferrals a worker logged (ms precision).
func deferrals(t *testing.T, w *workerProc) []workerDeferral {
	t.Helper()
	var ds []workerDeferral
	for _, line := range strings.Split(w.out.String(), "\n") {
		m := deferralLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("worker %s log: bad time in %q", w.name, line)
		}
		ds = append(ds, workerDeferral{at, m[2]})
	}
	return ds
}

// perQuarter counts arrivals per 250 ms from the first, to show the flow.
func perQuarter(arrivals []arrival) []int {
	if len(arrivals) == 0 {
		return nil
	}
	var n []int
	for _, a := range arrivals {
		i := int(a.At.Sub(arrivals[0].At) / (250 * time.Millisecond))
		for len(n) <= i {
			n = append(n, 0)
		}
		n[i]++
	}
	return n
}
