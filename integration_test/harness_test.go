//go:build integration

// Package integration_test runs the pipeline end to end: worker and enqueue
// binaries built once per test binary, a redis-server of each test's own
// (internal/redistest) and a local HTTP server standing in for a webhook
// provider that records every request it gets.
//
// This file is the shared harness: the binaries (TestMain), the fleet of
// worker processes with their config, the recording webhook, metrics and
// queue helpers. The invariant checks are in invariants_test.go.
package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
)

// ---------------------------------------------------------------------------
// Binaries

// binDir holds the binaries built for this test binary; TestMain removes it.
var binDir string

// TestMain makes the directory the binaries are built into and removes it
// at the end. The binaries themselves are built on first use (buildBinary),
// so `go test -run TestWorkerRefusesBadConfig` builds only the worker.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "throttler-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration_test:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

var binaries sync.Map // command name ("worker", "enqueue") -> *builtBinary

// moduleRoot is the repository root: the parent of this package's directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

// buildBinary builds ./cmd/<name> once per test binary with `go build -o`
// and returns its path; a failed build fails every test that needs it.
func buildBinary(t testing.TB, name string) string {
	t.Helper()
	root := moduleRoot(t)
	v, _ := binaries.LoadOrStore(name, &builtBinary{})
	b := v.(*builtBinary)
	b.once.Do(func() {
		b.path = filepath.Join(binDir, name)
		cmd := exec.Command("go", "build", "-o", b.path, "./cmd/"+name)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// childEnv is this process's environment without REDIS_URL, which would
// replace the redis.url of the configs the tests write.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "REDIS_URL=") })
}

// ---------------------------------------------------------------------------
// The recording webhook provider

// arrival is one request the webhook received.
type arrival struct {
	At        time.Time // when the handler started: the test process's clock
	Answered  time.Time // just before the answer was written
	Key       string    // Idempotency-Key header (the task ID)
	Worker    string    // X-Worker header: which worker process sent it
	Recipient string
	Template  string
	Data      json.RawMessage // the message's data (a digest's: its messages)
	Status    int
}

// hookAnswer is what the webhook answers one request.
type hookAnswer struct {
	Status     int             // 0: 200
	RetryAfter string          // Retry-After header, if set
	Hold       <-chan struct{} // if set, the answer waits until it is closed (or 10 s)
	// Slow, if set, is how long the provider takes to accept the message;
	// one whose sender hangs up meanwhile is not accepted (status 499).
	Slow time.Duration
}

// statusHungUp is the status recorded for a message whose sender hung up
// before a slow provider accepted it (hookAnswer.Slow): not delivered.
const statusHungUp = 499

// hookServer is an httptest server that records every request and answers
// what answer says (200 when answer is nil).
type hookServer struct {
	srv *httptest.Server

	mu       sync.Mutex
	arrivals []arrival
	answer   func(a arrival, seq int) hookAnswer // seq: 0-based arrival number
	arrived  chan struct{}                       // gets a value per arrival, never blocks
}

func newHookServer(t testing.TB, answer func(a arrival, seq int) hookAnswer) *hookServer {
	h := &hookServer{answer: answer, arrived: make(chan struct{}, 1)}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookServer) URL() string { return h.srv.URL + "/send" }

func (h *hookServer) serve(w http.ResponseWriter, r *http.Request) {
	a := arrival{At: time.Now(), Key: r.Header.Get("Idempotency-Key"), Worker: r.Header.Get("X-Worker")}
	var m providers.Message
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
		return
	}
	a.Recipient, a.Template, a.Data = m.Recipient, m.Template, m.Data
	h.mu.Lock()
	seq := len(h.arrivals)
	h.arrivals = append(h.arrivals, a)
	ans := hookAnswer{}
	if h.answer != nil {
		ans = h.answer(a, seq)
	}
	h.mu.Unlock()
	select {
	case h.arrived <- struct{}{}:
	default:
	}
	if ans.Hold != nil {
		select {
		case <-ans.Hold:
		case <-time.After(10 * time.Second):
		}
	}
	if ans.Slow > 0 {
		select {
		case <-time.After(ans.Slow):
		case <-r.Context().Done():
			ans.Status = statusHungUp
		}
	}
	if ans.Status == 0 {
		ans.Status = http.StatusOK
	}
	if ans.RetryAfter != "" {
		w.Header().Set("Retry-After", ans.RetryAfter)
	}
	h.mu.Lock()
	h.arrivals[seq].Status = ans.Status
	h.arrivals[seq].Answered = time.Now()
	h.mu.Unlock()
	w.WriteHeader(ans.Status)
	fmt.Fprintf(w, "status %d\n", ans.Status)
}

// snapshot returns the arrivals so far, in arrival order.
func (h *hookServer) snapshot() []arrival {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.arrivals)
}

// delivered returns the task IDs the webhook accepted (2xx) and how often each.
func (h *hookServer) delivered() map[string]int {
	got := map[string]int{}
	for _, a := range h.snapshot() {
		if a.Status >= 200 && a.Status < 300 {
			got[a.Key]++
		}
	}
	return got
}

// ---------------------------------------------------------------------------
// The fleet: a redis-server, a webhook and worker processes sharing a config

// fleetConfig is what differs between the tests' configs.
type fleetConfig struct {
	Concurrency     int
	ShutdownTimeout time.Duration
	InlineWait      time.Duration
	Jitter          time.Duration
	Policy          string  // YAML list of windows of policy "pace" (or its long form)
	MorePolicies    string  // more policies: lines after the policies: key, each "\n  name: ..."
	ProviderMore    string  // more settings of provider "hook", each "\n    key: value"
	Rate            float64 // of provider "hook"
	Burst           int
	Book            bool // worker.book: a job that may not go books its moment
	// BookAhead, if set, is worker.book_ahead (else the file's default).
	BookAhead time.Duration
	// Tenants, if set, is the config's tenants section (the lines after
	// "tenants:").
	Tenants string
	// Campaigns, if set, is the config's campaigns section (the lines
	// after "campaigns:"); their audience files are written from Files.
	Campaigns string
	Files     map[string]string // file name in the fleet's dir -> content
	// API, if set, is the config's api section (the lines after "api:").
	API string
	// Events, if set, is the config's events section (the lines after
	// "events:").
	Events string
	// ACL, if set, runs the workers and enqueue as the least-privilege user
	// config.yaml recommends (the test's own reads stay the admin's).
	ACL bool
	// Shards, if set, is redis.shards; else the default: 1 on one Redis,
	// the number of masters on a cluster (see shards).
	Shards int
	// Durable runs the fleet's redis-server with appendfsync always
	// (redistest.StartDurable; a cluster's nodes: StartDurableCluster), for
	// the tests that kill it.
	Durable bool
}

// The ACL user the fleets log in as when fleetConfig.ACL is set.
const (
	aclUser     = "throttler"
	aclPassword = "acl-test-password"
)

// startRedis starts the fleet's standalone redis-server: with the
// recommended ACL user when acl is set.
func startRedis(t testing.TB, acl bool) *redistest.Server {
	t.Helper()
	if !acl {
		return redistest.Start(t)
	}
	return redistest.StartWith(t, redistest.Options{Users: []string{redistest.RecommendedACL(t, "../config.yaml", aclUser, aclPassword)}})
}

// redisURL is the URL the fleet's processes connect with: as the ACL user
// when acl is set.
func redisURL(s *redistest.Server, acl bool) string {
	if acl {
		return s.URL(aclUser, aclPassword) + "/0"
	}
	return fmt.Sprintf("redis://%s/0", s.Addr)
}

type fleet struct {
	t     testing.TB
	dir   string
	cfg   fleetConfig
	redis *redistest.Server     // nil for a cluster fleet
	rdb   redis.UniversalClient // a *redis.Client, or a *redis.ClusterClient for a cluster fleet
	insp  *asynq.Inspector
	// masterLost says a cluster master was lost mid-run: the writes it had
	// acknowledged and not yet passed to its replica are gone, a ledger
	// entry among them, so checkRun counts a send with no ledger entry
	// (runCounts.noToken) for the test to bound, rather than failing it.
	masterLost bool
	// cluster is set for a fleet on a Redis Cluster (newClusterFleet).
	cluster *redistest.Cluster
	hook    *hookServer
	// bucketExtra, if set, is how many sends beyond the bucket checkRun
	// lets known bugs add in an interval (extraWhy names them).
	bucketExtra func(from, to time.Time) float64
	extraWhy    string
	// arrivalSlack, if set, replaces skewTolerance in checkRun's checks on
	// arrivals, for a test that checks them its own way (TestChaosKill9).
	arrivalSlack time.Duration
	// seen is every task's quota entry as last read by watchQuotas.
	seenMu sync.Mutex
	seen   map[string]time.Time
}

// Names in the configs the fleet writes.
const (
	fleetQueue    = "default"
	fleetPolicy   = "pace"
	fleetProvider = "hook"
	fleetPrefix   = "throttle:"
)

func newFleet(t testing.TB, cfg fleetConfig, answer func(a arrival, seq int) hookAnswer) *fleet {
	t.Helper()
	f := &fleet{t: t, dir: t.TempDir(), cfg: cfg}
	if cfg.Durable {
		f.redis = redistest.StartDurable(t)
	} else {
		f.redis = startRedis(t, cfg.ACL)
	}
	f.rdb = f.redis.Client(t)
	f.insp = asynq.NewInspectorFromRedisClient(f.rdb)
	f.hook = newHookServer(t, answer)
	f.watchQuotas()
	return f
}

// newClusterFleet is newFleet on a Redis Cluster of masters masters with
// replicas replicas each: the configs it writes have redis.cluster (the
// master addresses) instead of redis.url. The test's own client is the
// workers' kind (redisconn), so that it follows a failover as they do.
func newClusterFleet(t *testing.T, masters, replicas int, cfg fleetConfig, answer func(a arrival, seq int) hookAnswer) *fleet {
	t.Helper()
	f := &fleet{t: t, dir: t.TempDir(), cfg: cfg}
	if cfg.Durable {
		f.cluster = redistest.StartDurableCluster(t, masters, replicas)
	} else {
		f.cluster = redistest.StartCluster(t, masters, replicas)
	}
	rdb, closeRedis, err := redisconn.Connect(context.Background(), redisconn.Config{Cluster: f.cluster.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeRedis() })
	f.rdb = rdb
	f.insp = asynq.NewInspectorFromRedisClient(f.rdb)
	f.hook = newHookServer(t, answer)
	f.watchQuotas()
	return f
}

// redisSection is the config's redis lines (after "redis:"): the url of
// the fleet's server, or the cluster's master addresses.
func (f *fleet) redisSection() string {
	shards := ""
	if f.cfg.Shards > 0 {
		shards = fmt.Sprintf("\n  shards: %d", f.cfg.Shards)
	}
	if f.cluster != nil {
		return fmt.Sprintf("cluster: [%s]%s", strings.Join(f.cluster.Addrs(), ", "), shards)
	}
	return "url: " + redisURL(f.redis, f.cfg.ACL) + shards
}

// shards is the number of shards of each queue the fleet's workers serve
// and its producers fill (redisconn.Shards).
func (f *fleet) shards() int {
	switch {
	case f.cfg.Shards > 0:
		return f.cfg.Shards
	case f.cluster != nil:
		return len(f.cluster.Addrs())
	}
	return 1
}

// writeConfig writes the config of one worker (or of enqueue) and returns
// its path. Each worker gets its own metrics port and X-Worker header.
func (f *fleet) writeConfig(name, metricsAddr string) string {
	f.t.Helper()
	c := f.cfg
	bookAhead := ""
	if c.BookAhead > 0 {
		bookAhead = fmt.Sprintf("\n  book_ahead: %s", c.BookAhead)
	}
	yaml := fmt.Sprintf(`# written by the integration test for %s
redis:
  %s
  prefix: %q
worker:
  concurrency: %d
  queues: {%s: 1}
  shutdown_timeout: %s
  http_addr: %q
  inline_wait: %s
  jitter: %s
  remember_takes: %s
  book: %t%s
policies:
  %s: %s%s
providers:
  %s:
    type: webhook
    url: %s
    timeout: 5s
    rate: %s
    burst: %d
    headers: {X-Worker: %s}%s
defaults: {policy: %s, provider: %s, queue: %s}
`, name, f.redisSection(), fleetPrefix, c.Concurrency, fleetQueue, c.ShutdownTimeout, metricsAddr,
		c.InlineWait, c.Jitter, fleetRemember, c.Book, bookAhead, fleetPolicy, c.Policy, c.MorePolicies, fleetProvider, f.hook.URL(),
		strconv.FormatFloat(c.Rate, 'f', -1, 64), c.Burst, name, c.ProviderMore,
		fleetPolicy, fleetProvider, fleetQueue)
	if c.Campaigns != "" {
		yaml += "campaigns:" + c.Campaigns
	}
	if c.Tenants != "" {
		yaml += "tenants:" + c.Tenants
	}
	if c.API != "" {
		yaml += "api:" + c.API
	}
	if c.Events != "" {
		yaml += "events:" + c.Events
	}
	for file, content := range c.Files {
		if err := os.WriteFile(filepath.Join(f.dir, file), []byte(content), 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
	path := filepath.Join(f.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// workerProc is one running worker binary.
type workerProc struct {
	name    string
	metrics string // host:port of /metrics and /healthz
	cmd     *exec.Cmd
	out     *syncBuffer // stdout and stderr
	done    chan struct{}
	err     error // Wait's error, once done is closed
	exited  time.Time
}

// startWorker starts a worker process with its own config and waits until
// its /healthz answers (asynq server started, Redis reachable).
func (f *fleet) startWorker(name string) *workerProc {
	f.t.Helper()
	return f.startWorkers(name)[0]
}

// startWorkers starts a worker process per name, each with its own config
// (metrics port, X-Worker header), and waits until all are healthy.
func (f *fleet) startWorkers(names ...string) []*workerProc {
	f.t.Helper()
	bin := buildBinary(f.t, "worker")
	var ws []*workerProc
	for _, name := range names {
		w := &workerProc{name: name, metrics: freeAddr(f.t), out: &syncBuffer{}, done: make(chan struct{})}
		w.cmd = exec.Command(bin, "-config", f.writeConfig(name, w.metrics))
		w.cmd.Env = childEnv()
		w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
		if err := w.cmd.Start(); err != nil {
			f.t.Fatal(err)
		}
		go func() {
			w.err = w.cmd.Wait()
			w.exited = time.Now()
			close(w.done)
		}()
		f.t.Cleanup(func() {
			w.terminate()
			if !w.wait(15 * time.Second) {
				_ = w.cmd.Process.Kill() // our own child, by its handle
				w.wait(5 * time.Second)
			}
			if f.t.Failed() {
				f.t.Logf("--- worker %s output (tail) ---\n%s", w.name, tail(w.out.String(), 40))
			}
		})
		ws = append(ws, w)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, w := range ws {
		for !w.healthy() {
			select {
			case <-w.done:
				f.t.Fatalf("worker %s exited before it was ready: %v\n%s", w.name, w.err, w.out.String())
			default:
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("worker %s not healthy after 20s\n%s", w.name, w.out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return ws
}

// healthy reports whether the worker's /healthz answers 200.
func (w *workerProc) healthy() bool {
	resp, err := http.Get("http://" + w.metrics + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// terminate sends SIGTERM to the worker (if it still runs).
func (w *workerProc) terminate() {
	select {
	case <-w.done:
	default:
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// wait reports whether the worker exited within d.
func (w *workerProc) wait(d time.Duration) bool {
	select {
	case <-w.done:
		return true
	case <-time.After(d):
		return false
	}
}

// stop sends SIGTERM and waits for a clean exit (status 0).
func (f *fleet) stop(w *workerProc) {
	f.t.Helper()
	w.terminate()
	if !w.wait(f.cfg.ShutdownTimeout + 10*time.Second) {
		f.t.Fatalf("worker %s still running %s after SIGTERM", w.name, f.cfg.ShutdownTimeout+10*time.Second)
	}
	if w.err != nil {
		f.t.Errorf("worker %s exited with %v after SIGTERM, want status 0\n%s", w.name, w.err, tail(w.out.String(), 20))
	}
}

// metricsOf scrapes the workers' /metrics and returns every series summed
// over them, keyed by "name{labels}" as Prometheus prints it.
func (f *fleet) metricsOf(ws ...*workerProc) map[string]float64 {
	f.t.Helper()
	sum := map[string]float64{}
	for _, w := range ws {
		resp, err := http.Get("http://" + w.metrics + "/metrics")
		if err != nil {
			f.t.Fatalf("scrape %s: %v", w.name, err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				f.t.Fatalf("scrape %s: bad line %q", w.name, line)
			}
			sum[line[:i]] += v
		}
		resp.Body.Close()
	}
	return sum
}

// ---------------------------------------------------------------------------
// Enqueueing in process (the tests that are about the worker side) and the
// queue's state

// enqueue puts one notification on the queue through message.NewTask, as the
// enqueue command does, with the task ID derived from key, and keeps the
// completed task for an hour so the inspector can count it.
func (f *fleet) enqueue(client *asynq.Client, key string, n message.Notification) string {
	f.t.Helper()
	if n.Policy == "" {
		n.Policy = fleetPolicy
	}
	if n.Provider == "" {
		n.Provider = fleetProvider
	}
	id := message.TaskID(key)
	task, err := message.NewTask(n, id, asynq.Queue(asynqdb.ShardOf(fleetQueue, id, f.shards())), asynq.Retention(time.Hour))
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := client.Enqueue(task); err != nil {
		f.t.Fatalf("enqueue %s: %v", key, err)
	}
	return id
}

// queueState is the queue's counts, summed over its shards; zero values
// when the queue does not exist yet. A read that fails is tried again for
// up to readRetry: on a cluster, a master just killed refuses the first
// reads until the client's slot map follows the promotion, as the workers'
// calls are.
func (f *fleet) queueState() asynq.QueueInfo {
	f.t.Helper()
	var sum asynq.QueueInfo
	var err error
	for deadline := time.Now().Add(readRetry); ; time.Sleep(100 * time.Millisecond) {
		if sum, err = f.readQueueState(); err == nil {
			return sum
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("queue state: %v (still failing after %s)", err, readRetry)
		}
	}
}

// readRetry is how long the harness tries a failing read again: past a
// cluster's failover and its clients' slot map reload.
const readRetry = 20 * time.Second

func (f *fleet) readQueueState() (asynq.QueueInfo, error) {
	var sum asynq.QueueInfo
	queues, err := f.insp.Queues()
	if err != nil {
		return sum, fmt.Errorf("queues: %w", err)
	}
	for _, q := range queues {
		if asynqdb.BaseQueue(q) != fleetQueue {
			continue
		}
		qi, err := f.insp.GetQueueInfo(q)
		if err != nil {
			if strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found") {
				continue
			}
			return sum, fmt.Errorf("queue info of %s: %w", q, err)
		}
		sum.Queue = fleetQueue
		sum.Pending += qi.Pending
		sum.Active += qi.Active
		sum.Scheduled += qi.Scheduled
		sum.Retry += qi.Retry
		sum.Archived += qi.Archived
		sum.Completed += qi.Completed
		sum.Size += qi.Size
	}
	return sum, nil
}

// waitSettled waits until nothing is pending, active, scheduled or waiting
// for a retry, and done() says every task has ended (sent or archived).
func (f *fleet) waitSettled(timeout time.Duration, done func(q asynq.QueueInfo) bool) asynq.QueueInfo {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		q := f.queueState()
		if q.Pending+q.Active+q.Scheduled+q.Retry == 0 && done(q) {
			return q
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("queue not settled after %s: pending %d, active %d, scheduled %d, retry %d, archived %d, completed %d; webhook got %d requests",
				timeout, q.Pending, q.Active, q.Scheduled, q.Retry, q.Archived, q.Completed, len(f.hook.snapshot()))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shardNames are the asynq queues of the fleet's queue: its shards.
func (f *fleet) shardNames() []string {
	return asynqdb.Names(asynqdb.Served(map[string]int{fleetQueue: 1}, f.shards(), nil))
}

// archived returns the archived tasks of every shard by ID; LastErr is the
// reason.
func (f *fleet) archived() map[string]*asynq.TaskInfo {
	f.t.Helper()
	got := map[string]*asynq.TaskInfo{}
	for _, q := range f.shardNames() {
		for page := 1; ; page++ {
			ts, err := f.insp.ListArchivedTasks(q, asynq.PageSize(500), asynq.Page(page))
			if err != nil && !strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "does not exist") {
				f.t.Fatalf("list archived: %v", err)
			}
			for _, ti := range ts {
				got[ti.ID] = ti
			}
			if len(ts) < 500 {
				break
			}
		}
	}
	return got
}

// ledger returns the provider bucket's ledger: the task IDs holding one of
// its slots and the earliest moment (the bucket's Redis time) each slot
// lets its task go: the slot's start V less the slack (burst - 1 over the
// rate). Slots never overlap, so these moments keep the bucket's bound
// exactly; a task goes at or after its moment. (Its recipient's windows are
// checked on its quota entries: quotaMoments.) A task whose send failed at
// the provider (5xx, 429) holds the slot its retry took; the failed
// attempt's is gone from the ledger.
func (f *fleet) ledger() map[string]time.Time {
	f.t.Helper()
	ctx := context.Background()
	zs, err := f.rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: ledgerKey, ByScore: true, Start: "-inf", Stop: "(0"}).Result()
	if err != nil {
		f.t.Fatalf("ledger: %v", err)
	}
	slack := time.Duration(float64(f.cfg.Burst-1) / f.cfg.Rate * float64(time.Second)).Truncate(time.Microsecond)
	got := map[string]time.Time{}
	for _, z := range zs {
		got[strings.TrimPrefix(z.Member.(string), keyspace.LedgerEntry(""))] = time.UnixMicro(-int64(z.Score)).Add(-slack)
	}
	return got
}

// quotaPoll is how often watchQuotas reads the quota sets.
const quotaPoll = 300 * time.Millisecond

// watchQuotas reads every quota set each quotaPoll until the test ends, so
// that quotaMoments has the entries that a later write pruned (a set keeps
// an entry only while some window counts it: read at the end, it no longer
// holds the early ones, and the ledger's slot is not their moment). An
// entry stays in its set at least the longest window after its moment, far
// longer than quotaPoll. Read errors (a Redis the test restarts) are
// skipped: the final read in quotaMoments must succeed.
func (f *fleet) watchQuotas() {
	f.seen = map[string]time.Time{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(quotaPoll)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if got, err := f.readQuotas(context.Background()); err == nil {
					f.seenMu.Lock()
					maps.Copy(f.seen, got)
					f.seenMu.Unlock()
				}
			}
		}
	}()
	f.t.Cleanup(func() { close(stop); <-done })
}

// quotaMoments returns the moment of every task's quota entry (the fleet's
// policies' keys, on every node): the moment its recipient's windows were
// checked at, on the recipient's node; for an entry pruned since, the
// moment watchQuotas last read.
func (f *fleet) quotaMoments() map[string]time.Time {
	got, err := f.readQuotas(context.Background())
	if err != nil {
		f.t.Fatalf("quota entries: %v", err)
	}
	f.seenMu.Lock()
	defer f.seenMu.Unlock()
	all := map[string]time.Time{}
	maps.Copy(all, f.seen)
	maps.Copy(all, got)
	return all
}

// readQuotas reads every task's quota entry once.
func (f *fleet) readQuotas(ctx context.Context) (map[string]time.Time, error) {
	got := map[string]time.Time{}
	var mu sync.Mutex
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, fleetPrefix+"{*}:q:*", 1000).Iterator()
		for iter.Next(ctx) {
			zs, err := c.ZRangeWithScores(ctx, iter.Val(), 0, -1).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, z := range zs {
				id, _, _ := strings.Cut(z.Member.(string), "\x1f")
				got[id] = time.UnixMicro(int64(z.Score))
			}
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := f.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, scan)
	} else {
		err = scan(ctx, f.rdb.(*redis.Client))
	}
	return got, err
}

// entryOr is the task's quota entry moment, or g when it has none.
func entryOr(entries map[string]time.Time, id string, g time.Time) time.Time {
	if m, ok := entries[id]; ok {
		return m
	}
	return g
}

// ledgerKey is the provider bucket's calendar, which holds its ledger:
// <prefix>{<provider>}:b:<provider>:slots (internal/keyspace), each entry
// keyspace.LedgerEntry(task) scored minus its slot's start.
const ledgerKey = fleetPrefix + "{" + fleetProvider + "}:b:" + fleetProvider + ":slots"

// fleetRemember is the workers' worker.remember_takes: not the default
// (2s), so that a test can see it applied and the ledger keeps every take
// of a test.
const fleetRemember = 9 * time.Minute

// quotaKey is the recipient's sorted set under the fleet's policy.
func quotaKey(recipient string) string {
	return fleetPrefix + "{" + recipient + "}:q:" + fleetPolicy
}

// arrivalTolerance is the tolerance of checkRun's checks on arrivals:
// skewTolerance unless the test set arrivalSlack.
func (f *fleet) arrivalTolerance() time.Duration {
	if f.arrivalSlack > 0 {
		return f.arrivalSlack
	}
	return skewTolerance
}

// ---------------------------------------------------------------------------
// Small things

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for a child's output and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runCommand runs a binary to completion (at most a minute) and returns its
// stdout, stderr and exit code.
func runCommand(t testing.TB, dir string, stdin io.Reader, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: still running after a minute\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), errb.String())
	}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s: %v", bin, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// jsonlLine is one line of an enqueue -file input, as the tests write them.
type jsonlLine struct {
	Recipient      string            `json:"recipient"`
	Template       string            `json:"template"`
	Data           map[string]string `json:"data,omitempty"`
	IdempotencyKey string            `json:"idempotency_key"`
	SendBy         string            `json:"send_by,omitempty"`
	Tenant         string            `json:"tenant,omitempty"`
}
