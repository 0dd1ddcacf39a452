package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/fleet"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/screen"
	"github.com/notify-throttle/throttler/throttle"
)

// harness runs a real asynq server with the throttle as its handler on a
// redis-server of the test's own, delivering to a recording provider.
type harness struct {
	rdb    *redis.Client
	client *asynq.Client
	insp   *asynq.Inspector
	lim    *throttle.Limiter
	th     *Throttle

	mu       sync.Mutex
	sent     map[string]time.Time          // task ID -> when the provider last got it
	sends    map[string]int                // task ID -> how many times the provider got it
	returned map[string]time.Time          // task ID -> when its handler first returned
	runs     map[string]int                // task ID -> how many times its handler ran
	fail     func(providers.Message) error // what the provider answers, nil: accept
}

// harnessConfig says what newHarnessWith builds; the zero value of each
// field but the rules means the default.
type harnessConfig struct {
	quota      *throttle.Quota
	bucket     *throttle.Bucket
	inlineWait time.Duration
	// server is the redis-server to use; nil takes a database of the
	// package's shared server.
	server *redistest.Server
	// noMarks runs without sent markers.
	noMarks bool
	// provider, if set, delivers instead of the recording provider.
	provider providers.Provider
	// latency is how long the recording provider takes to answer.
	latency time.Duration
	// retryDelay, if set, replaces RetryDelay(0) as asynq's RetryDelayFunc.
	retryDelay asynq.RetryDelayFunc
	// wrap, if set, wraps the client the asynq server uses.
	wrap func(*redis.Client) *redis.Client
	// book turns on Throttle.Book.
	book bool
	// fleet, if set, is the throttle's Fleet.
	fleet Fleet
	// member runs this worker's part in the fleet (package fleet) as the
	// throttle's Fleet: jobs deferred to a moment are woken at it.
	member bool
	// settings are the policy's settings beyond its windows.
	settings PolicySettings
	// more are policies besides "mkt", with their settings.
	more       map[string]PolicySettings
	moreQuotas map[string]*throttle.Quota
	// shadowBucket puts the provider's bucket in shadow mode.
	shadowBucket bool
	// digests turns Throttle.Digests on.
	digests bool
	// forwardEvery, if set, is asynq's DelayedTaskCheckInterval instead of
	// 100 ms: the worker's own is a second.
	forwardEvery time.Duration
	// screen turns Throttle.Screen on.
	screen bool
	// lateAfter is Throttle.LateAfter (the worker's: window_margin / 2).
	lateAfter time.Duration
	// log, if set, gets the throttle's log lines (text).
	log io.Writer
}

func newHarness(t *testing.T, quota *throttle.Quota, bucket *throttle.Bucket, inlineWait time.Duration) *harness {
	t.Helper()
	return newHarnessWith(t, harnessConfig{quota: quota, bucket: bucket, inlineWait: inlineWait})
}

func newHarnessWith(t *testing.T, c harnessConfig) *harness {
	t.Helper()
	db := 0
	if c.server == nil {
		c.server, db = shared.Server, shared.DB(t)
	}
	rdb := c.server.ClientOn(t, db)
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{rdb: rdb, lim: lim, sent: map[string]time.Time{}, sends: map[string]int{}, returned: map[string]time.Time{}, runs: map[string]int{},
		client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb)}
	provider := c.provider
	if provider == nil {
		provider = providers.Func(func(ctx context.Context, m providers.Message) (string, error) {
			time.Sleep(c.latency)
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.fail != nil {
				if err := h.fail(m); err != nil {
					return "", err
				}
			}
			h.sent[m.ID] = time.Now()
			h.sends[m.ID]++
			return "p-" + m.ID, nil
		})
	}
	workerRDB := c.server.ClientOn(t, db)
	if c.wrap != nil {
		workerRDB = c.wrap(workerRDB)
	}
	workerLim, err := throttle.New(workerRDB, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.th = &Throttle{
		Limiter: workerLim,
		Rules:   Rules{Policies: map[string]*throttle.Quota{"mkt": c.quota}, Providers: map[string]Route{"gw": {Bucket: c.bucket, Provider: provider, Shadow: c.shadowBucket}}, Settings: map[string]PolicySettings{"mkt": c.settings}},
		Fleet:   c.fleet,
		Log:     slog.New(slog.NewTextHandler(cmp.Or[io.Writer](c.log, io.Discard), nil)),
		Pacing:  Pacing{InlineWait: c.inlineWait, LateAfter: c.lateAfter, Book: c.book},
	}
	if !c.noMarks {
		h.th.Sent = NewSentMarks(workerLim)
	}
	if c.member {
		m := fleet.New(workerRDB, []string{"default"}, fleet.Options{DeadAfter: -1, Lead: fleet.WakeLead(100 * time.Millisecond)})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		h.th.Fleet = m
	}
	if c.screen {
		h.th.Screen = screen.New(workerRDB, "")
	}
	if c.digests {
		h.th.Digests = digest.New(workerRDB, "", asynq.NewClientFromRedisClient(workerRDB))
	}
	for name, q := range c.moreQuotas {
		h.th.Policies[name], h.th.Settings[name] = q, c.more[name]
	}
	retryDelay := c.retryDelay
	if retryDelay == nil {
		retryDelay = RetryDelay(0)
	}
	// asynq looks for new tasks every 0.5 to 1.5 s by default (while its
	// queues are empty), and due retries were moved every second: the
	// scenarios mostly waited on those. At 100 ms a task runs about when
	// it is due.
	srv := startWorker(t, workerRDB, h.th, asynq.Config{
		Concurrency:              8,
		RetryDelayFunc:           retryDelay,
		TaskCheckInterval:        100 * time.Millisecond,
		DelayedTaskCheckInterval: cmp.Or(c.forwardEvery, 100*time.Millisecond),
		LogLevel:                 asynq.ErrorLevel,
	}, h.recordReturns)
	t.Cleanup(srv.Shutdown)
	return h
}

// recordReturns is a middleware that records when each task's handler
// first returned (harness.returned).
func (h *harness) recordReturns(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		err := next.ProcessTask(ctx, t)
		id, _ := asynq.GetTaskID(ctx)
		h.mu.Lock()
		if _, ok := h.returned[id]; !ok {
			h.returned[id] = time.Now()
		}
		h.runs[id]++
		h.mu.Unlock()
		return err
	})
}

// sentAt returns when the recording provider last got task id, and
// whether it has.
func (h *harness) sentAt(id string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.sent[id]
	return at, ok
}

// sentCount returns how many tasks the recording provider has got.
func (h *harness) sentCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sent)
}

// awaitSent waits until the recording provider has got n tasks.
func (h *harness) awaitSent(t *testing.T, n int, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); h.sentCount() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker sent %d jobs in %s, want %d", h.sentCount(), within, n)
		}
	}
}

// firstReturn returns when the handler of task id first returned, and
// whether it has.
func (h *harness) firstReturn(id string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.returned[id]
	return at, ok
}

// startWorker starts an asynq server on rdb whose handler of notifications
// and digests is th, as cmd/worker does: IsFailure set, and RetryDelay(0)
// unless cfg has a RetryDelayFunc. Middlewares in outer run around th.
// The caller shuts it down.
func startWorker(t *testing.T, rdb redis.UniversalClient, th *Throttle, cfg asynq.Config, outer ...asynq.MiddlewareFunc) *asynq.Server {
	t.Helper()
	cfg.IsFailure = IsFailure
	if cfg.RetryDelayFunc == nil {
		cfg.RetryDelayFunc = RetryDelay(0)
	}
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mux.Use(outer...)
	mux.Handle(message.TaskType, th)
	mux.Handle(digest.TaskType, th)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	return srv
}

func (h *harness) enqueue(t *testing.T, id string, n message.Notification) {
	t.Helper()
	if n.Policy == "" {
		n.Policy, n.Provider, n.Template = "mkt", "gw", "welcome"
	}
	task, err := message.NewTask(n, id, asynq.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
}

// await polls the task until cond holds.
func (h *harness) await(t *testing.T, id string, what string, cond func(*asynq.TaskInfo) bool) *asynq.TaskInfo {
	t.Helper()
	return h.awaitFor(t, id, what, 10*time.Second, cond)
}

// awaitFor is await with a deadline of its own.
func (h *harness) awaitFor(t *testing.T, id string, what string, within time.Duration, cond func(*asynq.TaskInfo) bool) *asynq.TaskInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		info, err := h.insp.GetTaskInfo("default", id)
		if err == nil && cond(info) {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s never became %s: %+v, %v", id, what, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) wasSent(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.sent[id]
	return ok
}

func quotaSize(t *testing.T, h *harness, recipient string) int64 {
	t.Helper()
	keys, _ := h.rdb.Keys(context.Background(), "throttle:{"+recipient+"}:q:*").Result()
	var n int64
	for _, k := range keys {
		n += h.rdb.ZCard(context.Background(), k).Val()
	}
	return n
}

func state(s asynq.TaskState) func(*asynq.TaskInfo) bool {
	return func(i *asynq.TaskInfo) bool { return i.State == s }
}

func TestHandlerSendsAndDefersWithoutUsingRetries(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarness(t, q, b, 0)
	h.enqueue(t, "first", message.Notification{Recipient: "alice"})
	h.await(t, "first", "completed", state(asynq.TaskStateCompleted))
	if !h.wasSent("first") {
		t.Fatal("first completed but the provider never got it")
	}
	h.enqueue(t, "second", message.Notification{Recipient: "alice"})
	info := h.await(t, "second", "deferred", state(asynq.TaskStateRetry))
	if info.Retried != 0 {
		t.Errorf("a deferral used up %d retries", info.Retried)
	}
	if !strings.HasPrefix(info.LastErr, "throttled by policy mkt (1 per 1h); next try in 59m") &&
		!strings.HasPrefix(info.LastErr, "throttled by policy mkt (1 per 1h); next try in 1h") {
		t.Errorf("deferral message %q", info.LastErr)
	}
	if wait := time.Until(info.NextProcessAt); wait < 59*time.Minute || wait > time.Hour+3*time.Second {
		t.Errorf("deferred for %s, want the hour the quota says (rounded up)", wait)
	}
	if h.wasSent("second") {
		t.Error("second was sent over the quota")
	}
}

// TestHandlerLogsTheProvidersID: the sent line names the ID the provider
// gave the message (provider_id), for matching its later reports.
func TestHandlerLogsTheProvidersID(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	log, err := os.Create(filepath.Join(t.TempDir(), "log")) // the handlers' goroutines write to it
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, log: log})
	h.enqueue(t, "first", message.Notification{Recipient: "alice@example.com"})
	h.await(t, "first", "completed", state(asynq.TaskStateCompleted))
	got, _ := os.ReadFile(log.Name())
	want := regexp.MustCompile(`level=INFO msg=sent task=first recipient=a\*\*\*@example.com .* provider_id=p-first\n`)
	if !want.Match(got) {
		t.Errorf("log\n%s\nhas no line matching %s", got, want)
	}
}

func TestHandlerArchivesWhatCanNeverGo(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarness(t, q, b, 0)
	past := time.Now().Add(-time.Minute)
	h.enqueue(t, "unknown-policy", message.Notification{Recipient: "a", Policy: "nope", Provider: "gw", Template: "x"})
	h.enqueue(t, "expired", message.Notification{Recipient: "b", SendBy: &past})
	h.enqueue(t, "blocker", message.Notification{Recipient: "c"})
	h.await(t, "blocker", "completed", state(asynq.TaskStateCompleted))
	soon := time.Now().Add(10 * time.Minute) // c's quota frees in an hour: too late
	h.enqueue(t, "too-late", message.Notification{Recipient: "c", SendBy: &soon})

	for id, reason := range map[string]string{
		"unknown-policy": `malformed notification: policy "nope" is not defined`,
		"expired":        "expired: send-by ",
		"too-late":       "expired: send-by ",
	} {
		info := h.await(t, id, "archived", state(asynq.TaskStateArchived))
		if !strings.HasPrefix(info.LastErr, reason) {
			t.Errorf("%s archived with %q, want it to start %q", id, info.LastErr, reason)
		}
		if h.wasSent(id) {
			t.Errorf("%s was sent", id)
		}
	}
	if n := quotaSize(t, h, "b"); n != 0 {
		t.Errorf("the expired job left %d quota entries", n)
	}
}

func TestHandlerGivesTheQuotaBackWhenTheSendFails(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarness(t, q, b, 0)
	h.fail = func(m providers.Message) error {
		switch m.Recipient {
		case "rejected":
			return sendErrorf(providers.Reject, 0, "400 Bad Request: no such number")
		case "flaky":
			return errors.New("503 Service Unavailable")
		}
		return nil
	}
	h.enqueue(t, "r", message.Notification{Recipient: "rejected"})
	h.enqueue(t, "f", message.Notification{Recipient: "flaky"})
	if info := h.await(t, "r", "archived", state(asynq.TaskStateArchived)); !strings.Contains(info.LastErr, "no such number") {
		t.Errorf("rejected message archived with %q", info.LastErr)
	}
	if info := h.await(t, "f", "retrying", state(asynq.TaskStateRetry)); info.Retried != 1 {
		t.Errorf("a 503 counted %d retries, want 1", info.Retried)
	}
	for _, who := range []string{"rejected", "flaky"} {
		if n := quotaSize(t, h, who); n != 0 {
			t.Errorf("%s: %d quota entries left after a failed send, want 0", who, n)
		}
	}
}

// handedOver is a Fleet for which every task went to another worker.
type handedOver struct{}

func (handedOver) Holds(context.Context) error        { return errors.New("handed over") }
func (handedOver) Wake(string, string, time.Duration) {}
func (handedOver) Lead() time.Duration                { return 0 }
func (handedOver) Waiting() bool                      { return false }

// TestHandlerSendsNothingHandedOver: a job whose task this worker no
// longer holds is not sent and is deferred by a minute, not failed, and
// what its admission took stays for the worker that now runs the task.
func TestHandlerSendsNothingHandedOver(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, fleet: handedOver{}})
	h.enqueue(t, "x", message.Notification{Recipient: "alice"})
	info := h.await(t, "x", "deferred", state(asynq.TaskStateRetry))
	if h.wasSent("x") {
		t.Error("sent a job handed over to another worker")
	}
	if info.Retried != 0 || !strings.HasPrefix(info.LastErr, "handed over: handed over; next try in 1m") {
		t.Errorf("retried %d, last error %q; want a deferral by a minute", info.Retried, info.LastErr)
	}
	if wait := time.Until(info.NextProcessAt); wait < 55*time.Second || wait > 65*time.Second {
		t.Errorf("deferred for %s, want a minute", wait)
	}
	if n := quotaSize(t, h, "alice"); n != 1 {
		t.Errorf("alice's quota holds %d entries, want the admission's 1 kept for the task", n)
	}
}

// TestHandlerRetryTakesAProviderTokenOfItsOwn: a send the provider
// answered 503 spent its token; the retry takes another rather than passing
// the bucket as already admitted (which let retries through unpaced). With
// one token an hour, the retry waits for the provider.
func TestHandlerRetryTakesAProviderTokenOfItsOwn(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1.0/3600, 1)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, retryDelay: quickBackoff})
	failed := false
	h.fail = func(m providers.Message) error { // called with h.mu held
		if !failed {
			failed = true
			return errors.New("503 Service Unavailable")
		}
		return nil
	}
	h.enqueue(t, "f", message.Notification{Recipient: "a"})
	info := h.await(t, "f", "throttled by the provider", func(i *asynq.TaskInfo) bool {
		return i.State == asynq.TaskStateRetry && strings.HasPrefix(i.LastErr, "throttled by provider gw")
	})
	if info.Retried != 1 {
		t.Errorf("retried %d times, want 1 (the 503; a deferral is no failure)", info.Retried)
	}
	if h.wasSent("f") {
		t.Error("the retry was sent although the bucket's only token went to the failed attempt")
	}
}

func TestHandlerPausesTheProviderOn429(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 100, 10)
	h := newHarness(t, q, b, 0)
	h.fail = func(m providers.Message) error {
		if m.ID == "hit" {
			return sendErrorf(providers.Pause, 30*time.Second, "429 Too Many Requests")
		}
		return nil
	}
	h.enqueue(t, "hit", message.Notification{Recipient: "a"})
	info := h.await(t, "hit", "deferred", state(asynq.TaskStateRetry))
	if info.Retried != 0 || !strings.HasPrefix(info.LastErr, "provider gw paused") {
		t.Errorf("429: %+v", info)
	}
	// Any other job for the provider now waits out the pause.
	d, err := h.lim.Admit(context.Background(), throttle.Request{ID: "probe", Takes: []throttle.Take{{Rule: b, Subject: "gw"}}})
	if err != nil || d.Allowed() || d.Delay < 25*time.Second {
		t.Errorf("admission during the pause: %+v, %v", d, err)
	}
}

func TestHandlerPacesShortProviderWaitsInline(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 5, 1) // one send every 200ms
	h := newHarness(t, q, b, time.Second)
	ids := []string{"p1", "p2", "p3", "p4"}
	for _, id := range ids {
		h.enqueue(t, id, message.Notification{Recipient: id})
	}
	var at []time.Time
	for _, id := range ids {
		info := h.await(t, id, "completed", state(asynq.TaskStateCompleted))
		if info.Retried != 0 || info.LastErr != "" {
			t.Errorf("%s was deferred (%q) instead of paced inline", id, info.LastErr)
		}
		h.mu.Lock()
		at = append(at, h.sent[id])
		h.mu.Unlock()
	}
	// The pacing shows in the bucket's grants (Redis time, from its ledger):
	// 200ms apart at least, and no send before its grant. Send times alone
	// can bunch when a busy machine wakes one sleeper late.
	held, err := h.rdb.ZRangeArgsWithScores(context.Background(), redis.ZRangeArgs{Key: "throttle:{gw}:b:gw:slots", ByScore: true, Start: "-inf", Stop: "(0"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]time.Time{}
	for _, z := range held { // the ledger's entries, in the calendar: "#" and the ID, scored minus the slot's start
		granted[strings.TrimPrefix(z.Member.(string), "#")] = time.UnixMicro(-int64(z.Score))
	}
	var moments []time.Time
	for i, id := range ids {
		g, ok := granted[id]
		if !ok {
			t.Fatalf("%s holds no token in the bucket's ledger: %v", id, held)
		}
		if early := g.Sub(at[i]); early > 2*time.Millisecond {
			t.Errorf("%s sent %s before its granted moment", id, early)
		}
		moments = append(moments, g)
	}
	slices.SortFunc(moments, time.Time.Compare)
	for i := 1; i < len(moments); i++ {
		if gap := moments[i].Sub(moments[i-1]); gap < 200*time.Millisecond-time.Microsecond {
			t.Errorf("grants %d and %d %s apart, want the bucket's 200ms", i, i+1, gap)
		}
	}
}

// awaitAll waits until every task in ids has completed.
func (h *harness) awaitAll(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var pending []string
		for _, id := range ids {
			info, err := h.insp.GetTaskInfo("default", id)
			if err != nil || info.State != asynq.TaskStateCompleted {
				pending = append(pending, id)
				if info != nil && info.State == asynq.TaskStateArchived {
					t.Fatalf("%s archived: %s", id, info.LastErr)
				}
			}
		}
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var states []string
			for _, id := range pending[:min(5, len(pending))] {
				info, err := h.insp.GetTaskInfo("default", id)
				if err != nil {
					states = append(states, fmt.Sprintf("%s: %v", id, err))
					continue
				}
				states = append(states, fmt.Sprintf("%s: %s retried %d, next %s, last error %q",
					id, info.State, info.Retried, info.NextProcessAt.Format(time.TimeOnly), info.LastErr))
			}
			t.Fatalf("%d of %d jobs not completed within %s:\n%s", len(pending), len(ids), within, strings.Join(states, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
