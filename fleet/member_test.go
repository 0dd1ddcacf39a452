package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/redistest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// activeTasks enqueues n tasks on queue q with asynq's Client and moves
// them to active as asynq's dequeue does (item 1 and 2 of the contract in
// internal/asynqdb, which TestContract checks against asynq itself).
func activeTasks(t *testing.T, rdb redis.UniversalClient, q, tag string, n int) []string {
	t.Helper()
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%03d", tag, i)
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(id), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
		if err := rdb.LRem(ctx, asynqdb.PendingKey(q), 0, id).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.LPush(ctx, asynqdb.ActiveKey(q), id).Err(); err != nil {
			t.Fatal(err)
		}
		rdb.HSet(ctx, asynqdb.TaskKey(q, id), "state", asynqdb.StateActive)
		rdb.HDel(ctx, asynqdb.TaskKey(q, id), "pending_since")
		rdb.ZAdd(ctx, asynqdb.LeaseKey(q), redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: id})
		ids = append(ids, id)
	}
	return ids
}

// holdAs records ids as held by worker in queue q, taken in their order,
// and sets the worker's last sign of life to ago before now (Redis's
// clock). It returns the worker's Member.
func holdAs(t *testing.T, rdb redis.UniversalClient, q, worker string, ago time.Duration, ids ...string) *Member {
	t.Helper()
	ctx := context.Background()
	r := New(rdb, []string{q}, Options{ID: worker, Log: quiet})
	for i, id := range ids {
		if _, _, err := r.hold(ctx, q, "take", fmt.Sprintf("%s:%d", id, i+1)); err != nil {
			t.Fatal(err)
		}
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, beatsKey(throttleDefaultPrefix, q), redis.Z{Score: float64(now.Add(-ago).UnixMilli()), Member: worker}).Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

const throttleDefaultPrefix = "throttle:"

// TestReapHandsOverOnlyTheDeadWorkersTasks: a reap moves the active tasks
// of a worker silent for longer than DeadAfter to the head of the queue,
// as asynq's requeue does, and nothing else: not the tasks of a worker
// that showed a sign of life within DeadAfter, not a dead worker's task
// that ended meanwhile, and not twice.
func TestReapHandsOverOnlyTheDeadWorkersTasks(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "default"
	dead := activeTasks(t, rdb, q, "dead", 3)
	alive := activeTasks(t, rdb, q, "alive", 3)
	ended := activeTasks(t, rdb, q, "ended", 1)
	holdAs(t, rdb, q, "w-dead", 6*time.Second, append(slices.Clone(dead), ended...)...)
	holdAs(t, rdb, q, "w-slow", 4*time.Second, alive...) // silent, not for long enough
	holdAs(t, rdb, q, "w-idle", time.Minute)             // dead, holding nothing
	// A worker that left gracefully holds nothing; its active task (one
	// its server gave up at shutdown) is asynq's.
	left := activeTasks(t, rdb, q, "left", 1)
	if err := holdAs(t, rdb, q, "w-left", time.Minute, left...).beat(ctx, q, "leave"); err != nil {
		t.Fatal(err)
	}
	// The ended task finished meanwhile (asynq's Done).
	rdb.LRem(ctx, asynqdb.ActiveKey(q), 0, ended[0])
	rdb.ZRem(ctx, asynqdb.LeaseKey(q), ended[0])
	rdb.Del(ctx, asynqdb.TaskKey(q, ended[0]))

	reg := prometheus.NewRegistry()
	r := New(rdb, []string{q}, Options{DeadAfter: 5 * time.Second, Log: quiet, Metrics: NewMetrics(reg)})
	hs, err := r.Reap(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	byWorker := map[string]Handover{}
	for _, h := range hs {
		byWorker[h.Worker] = h
	}
	if len(hs) != 2 || !slices.Equal(byWorker["w-dead"].Tasks, dead) || len(byWorker["w-idle"].Tasks) != 0 {
		t.Fatalf("reap: %+v; want w-dead's %v and w-idle with none", hs, dead)
	}
	if s := byWorker["w-dead"].Silent; s < 6*time.Second || s > 8*time.Second {
		t.Errorf("w-dead silent for %s, want about 6s", s)
	}
	// Pending holds the dead worker's tasks at its head (the right end),
	// in the order they were held.
	if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, dead) {
		t.Errorf("pending %v, want %v", got, dead)
	}
	for _, id := range dead {
		if s := rdb.HGet(ctx, asynqdb.TaskKey(q, id), "state").Val(); s != asynqdb.StatePending {
			t.Errorf("%s: state %q, want pending", id, s)
		}
		if rdb.ZScore(ctx, asynqdb.LeaseKey(q), id).Err() != redis.Nil {
			t.Errorf("%s still has a lease", id)
		}
	}
	active := rdb.LRange(ctx, asynqdb.ActiveKey(q), 0, -1).Val()
	slices.Sort(active)
	if want := append(slices.Clone(alive), left...); !slices.Equal(active, want) {
		t.Errorf("active %v, want the slow worker's and the one that left: %v", active, want)
	}
	for w, want := range map[string]int64{"w-slow": int64(len(alive)), "w-dead": 0, "w-idle": 0, "w-left": 0} {
		if n := rdb.SCard(ctx, heldKey(throttleDefaultPrefix, q, w)).Val(); n != want {
			t.Errorf("%s holds %d tasks, want %d", w, n, want)
		}
	}
	if ws := rdb.ZRange(ctx, beatsKey(throttleDefaultPrefix, q), 0, -1).Val(); !slices.Equal(ws, []string{"w-slow"}) {
		t.Errorf("beats %v, want [w-slow]", ws)
	}
	if got := rdb.Exists(ctx, asynqdb.TaskKey(q, ended[0])).Val(); got != 0 {
		t.Errorf("the ended task's hash is back")
	}
	if n := counter(t, r.o.Metrics.Recovered.WithLabelValues(q)); n != 3 {
		t.Errorf("recovered_tasks_total %g, want 3", n)
	}
	if n := observations(t, r.o.Metrics.Handover); n != 1 {
		t.Errorf("recovery_seconds has %d observations, want 1 (one recovery)", n)
	}
	if hs, err := r.Reap(ctx, q); err != nil || len(hs) != 0 {
		t.Errorf("second reap: %+v, %v; want nothing", hs, err)
	}
}

// TestReapHandsOverOrphans: an active task no worker holds whose lease
// went unextended for DeadAfter plus asynq's heartbeat (its dequeue's reply
// was lost) goes back to the head of the queue; a task just dequeued
// (its record yet to come) and one a live worker holds stay active.
func TestReapHandsOverOrphans(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "default"
	stale := func(ids ...string) { // leases last extended 11 s ago
		for _, id := range ids {
			rdb.ZAdd(ctx, asynqdb.LeaseKey(q), redis.Z{Score: float64(time.Now().Add(19 * time.Second).Unix()), Member: id})
		}
	}
	orphans := activeTasks(t, rdb, q, "orphan", 2)
	stale(orphans...)
	fresh := activeTasks(t, rdb, q, "fresh", 1)
	held := activeTasks(t, rdb, q, "held", 1)
	stale(held...)
	holdAs(t, rdb, q, "w-alive", 0, held...)

	reg := prometheus.NewRegistry()
	r := New(rdb, []string{q}, Options{DeadAfter: 5 * time.Second, Log: quiet, Metrics: NewMetrics(reg)})
	hs, err := r.Reap(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].Worker != "" || !slices.Equal(hs[0].Tasks, orphans) || hs[0].Silent != 10*time.Second {
		t.Fatalf("reap: %+v; want the orphans %v, unextended for 10s", hs, orphans)
	}
	if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, orphans) {
		t.Errorf("pending %v, want %v", got, orphans)
	}
	active := rdb.LRange(ctx, asynqdb.ActiveKey(q), 0, -1).Val()
	slices.Sort(active)
	if want := slices.Concat(fresh, held); !slices.Equal(active, want) {
		t.Errorf("active %v, want %v", active, want)
	}
	if n := counter(t, r.o.Metrics.Recovered.WithLabelValues(q)); n != 2 {
		t.Errorf("recovered_tasks_total %g, want 2", n)
	}
	if n := observations(t, r.o.Metrics.Handover); n != 0 {
		t.Errorf("recovery_seconds has %d observations, want none: no worker died", n)
	}
}

// TestReapersAtOnceMoveEachTaskOnce: reapers in several goroutines (several
// workers) reap the same queue at the same time; every task of the dead
// workers is moved exactly once.
func TestReapersAtOnceMoveEachTaskOnce(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q, workers, each, reapers = "default", 3, 100, 4
	var want []string
	for w := range workers {
		ids := activeTasks(t, rdb, q, fmt.Sprintf("w%d", w), each)
		holdAs(t, rdb, q, fmt.Sprintf("w%d", w), 10*time.Second, ids...)
		want = append(want, ids...)
	}
	var mu sync.Mutex
	var moved []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range reapers {
		r := New(rdb, []string{q}, Options{ID: fmt.Sprintf("reaper-%d", i), Log: quiet})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 20 {
				hs, err := r.Reap(ctx, q)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, h := range hs {
					moved = append(moved, h.Tasks...)
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	slices.Sort(moved)
	slices.Sort(want)
	if !slices.Equal(moved, want) {
		t.Errorf("moved %d tasks (%d distinct), want each of %d once", len(moved), len(slices.Compact(slices.Clone(moved))), len(want))
	}
	pending := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val()
	slices.Sort(pending)
	if !slices.Equal(pending, want) {
		t.Errorf("pending holds %d IDs, want each of the %d once", len(pending), len(want))
	}
	if n := rdb.LLen(ctx, asynqdb.ActiveKey(q)).Val(); n != 0 {
		t.Errorf("%d tasks left active", n)
	}
}

// TestReapOnCluster: on a Redis Cluster, with queues in different slots,
// each queue's reap moves its own dead tasks.
func TestReapOnCluster(t *testing.T) {
	rdb := redistest.StartCluster(t, 3, 0).Client(t)
	ctx := context.Background()
	queues := []string{"critical", "default", "low"}
	want := map[string][]string{}
	for _, q := range queues {
		want[q] = activeTasks(t, rdb, q, q, 5)
		holdAs(t, rdb, q, "w-dead", 10*time.Second, want[q]...)
	}
	r := New(rdb, queues, Options{Log: quiet})
	for _, q := range queues {
		hs, err := r.Reap(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 1 || !slices.Equal(hs[0].Tasks, want[q]) {
			t.Errorf("queue %s: %+v, want %v moved", q, hs, want[q])
		}
		if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, want[q]) {
			t.Errorf("queue %s: pending %v, want %v", q, got, want[q])
		}
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func observations(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestScriptsRunOnEmbeddedRedis: the embedded demo mode's server
// (miniredis, a different Lua) runs both scripts.
func TestScriptsRunOnEmbeddedRedis(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	const q = "default"
	ids := activeTasks(t, rdb, q, "dead", 2)
	holdAs(t, rdb, q, "w-dead", 10*time.Second, ids...)
	r := New(rdb, []string{q}, Options{Log: quiet})
	if err := r.beat(context.Background(), q, "beat"); err != nil {
		t.Fatal(err)
	}
	hs, err := r.Reap(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || !slices.Equal(hs[0].Tasks, ids) {
		t.Errorf("reap: %+v, want %v moved", hs, ids)
	}
	if got := rdb.LRange(context.Background(), asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, ids) {
		t.Errorf("pending %v, want %v", got, ids)
	}
}

// commandLog records the commands a client sends, scripts' by their mode.
type commandLog struct {
	mu   sync.Mutex
	cmds []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.log(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook logs the commands of a pipeline too: a take's SADD
// goes through the client's auto-pipeliner, which sends a batch of them as
// one.
func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			l.log(c)
		}
		return next(ctx, cmds)
	}
}

// log notes cmd, unless it is the handshake of a new connection (HELLO,
// CLIENT SETINFO, SELECT, AUTH), which is no command of the code under test.
func (l *commandLog) log(cmd redis.Cmder) {
	name := cmd.Name()
	switch name {
	case "hello", "client", "select", "auth":
		return
	case "evalsha", "eval":
		name += " " + fmt.Sprint(cmd.Args()[len(cmd.Args())-1]) // hold.lua's mode, for a take
	}
	l.mu.Lock()
	l.cmds = append(l.cmds, name)
	l.mu.Unlock()
}

func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.cmds
	l.cmds = nil
	return c
}

// oneScriptCall reports whether cmds are one script call: an EVALSHA, and
// the EVAL that follows it where the server had not loaded the script yet
// (a fresh server, or one whose scripts were flushed).
func oneScriptCall(cmds []string) bool {
	switch len(cmds) {
	case 1:
		return strings.HasPrefix(cmds[0], "evalsha")
	case 2:
		return strings.HasPrefix(cmds[0], "evalsha") && strings.HasPrefix(cmds[1], "eval ")
	}
	return false
}

// TestTakeIsOneSADDWhileAlive: a task started while the worker's signs of
// life are fresh costs one command, a SADD; one started before the first
// sign, or after a silence, is a sign of life too (hold.lua's take), so that
// the worker is not taken for dead with it.
func TestTakeIsOneSADDWhileAlive(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	log := &commandLog{}
	rdb.AddHook(log)
	ctx := context.Background()
	const q = "default"
	r := New(rdb, []string{q}, Options{ID: "w", DeadAfter: time.Hour, Log: quiet})
	if _, err := r.take(ctx, q, "first:1"); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !oneScriptCall(got) {
		t.Errorf("a take before any sign of life sent %v, want one script call", got)
	}
	if err := r.beat(ctx, q, "beat"); err != nil {
		t.Fatal(err)
	}
	log.take()
	for i := range 3 {
		if _, err := r.take(ctx, q, fmt.Sprintf("task-%d:%d", i, i+2)); err != nil {
			t.Fatal(err)
		}
	}
	if got := log.take(); !slices.Equal(got, []string{"sadd", "sadd", "sadd"}) {
		t.Errorf("takes while alive sent %v, want one SADD each", got)
	}
	r.signs[q].last.Add(-int64(time.Hour / 2)) // the last sign now lies DeadAfter/2 back: a silence
	if _, err := r.take(ctx, q, "after:5"); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !oneScriptCall(got) {
		t.Errorf("a take after a silence sent %v, want one script call", got)
	}
	members := rdb.SMembers(ctx, heldKey(throttleDefaultPrefix, q, "w")).Val()
	slices.Sort(members)
	if want := []string{"after:5", "first:1", "task-0:2", "task-1:3", "task-2:4"}; !slices.Equal(members, want) {
		t.Errorf("held %v, want %v", members, want)
	}
}

// TestBeatDropsTheRunsThatEnded: a beat drops the runs that ended since the
// last, in one call, and not a later run of the same task (a task deferred
// and dequeued again by the same worker before the beat).
func TestBeatDropsTheRunsThatEnded(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "default"
	r := holdAs(t, rdb, q, "w", 0, "a", "b", "a", "c") // a:1, b:2, a:3, c:4
	r.finished[q] = []string{"a:1", "b:2"}
	log := &commandLog{}
	rdb.AddHook(log)
	if err := r.beat(ctx, q, "beat"); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); len(got) != 1 {
		t.Errorf("the beat sent %v, want one script call", got)
	}
	members := rdb.SMembers(ctx, heldKey(throttleDefaultPrefix, q, "w")).Val()
	slices.Sort(members)
	if want := []string{"a:3", "c:4"}; !slices.Equal(members, want) {
		t.Errorf("held %v, want %v", members, want)
	}
	if len(r.finished[q]) != 0 {
		t.Errorf("finished %v after the beat, want none", r.finished[q])
	}
}

// TestReapLeavesATaskALiveWorkerRuns: a dead worker's set still names a
// task it deferred before it died (asynq moved the task to retry, then
// gave it to another worker, which runs it now). The reap drops the dead
// worker's record and leaves the task active: moved back to pending, it
// would run in two workers at once.
func TestReapLeavesATaskALiveWorkerRuns(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	const q = "default"
	task := activeTasks(t, rdb, q, "again", 1)
	holdAs(t, rdb, q, "w-dead", 6*time.Second, task...)
	holdAs(t, rdb, q, "w-live", 0, task...)
	r := New(rdb, []string{q}, Options{DeadAfter: 5 * time.Second, Log: quiet})
	hs, err := r.Reap(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].Worker != "w-dead" || len(hs[0].Tasks) != 0 {
		t.Errorf("reap: %+v; want w-dead with no task moved", hs)
	}
	if active := rdb.LRange(ctx, asynqdb.ActiveKey(q), 0, -1).Val(); !slices.Equal(active, task) {
		t.Errorf("active %v, want %v: the live worker's run", active, task)
	}
	if n := rdb.LLen(ctx, asynqdb.PendingKey(q)).Val(); n != 0 {
		t.Errorf("%d pending, want none", n)
	}
	if n := rdb.Exists(ctx, heldKey(throttleDefaultPrefix, q, "w-dead")).Val(); n != 0 {
		t.Errorf("the dead worker's set is still there")
	}
}

// TestDeadInOneQueueIsDeadInAll: a worker beats its queues one after
// another, so its last signs differ a little from queue to queue; found
// dead in one queue, it is dead in every queue of the same sweep, the ones
// judged before included, and one sweep hands over all its tasks (on a
// cluster a queue's shards are such queues: without this a dead worker's
// tasks in one shard went a sweep, a second, after the others').
func TestDeadInOneQueueIsDeadInAll(t *testing.T) {
	t.Parallel()
	rdb, _ := shared.NewClient(t)
	ctx := context.Background()
	first := activeTasks(t, rdb, "q1", "first", 2)
	second := activeTasks(t, rdb, "q2", "second", 2)
	holdAs(t, rdb, "q1", "w-dead", 4*time.Second, first...) // not yet dead by q1's signs alone
	holdAs(t, rdb, "q2", "w-dead", 6*time.Second, second...)
	// A worker cut off from q3's node beats on in q4: it is not dead there.
	cut := activeTasks(t, rdb, "q4", "cut", 1)
	holdAs(t, rdb, "q3", "w-cut", 6*time.Second)
	holdAs(t, rdb, "q4", "w-cut", time.Second, cut...)
	r := New(rdb, []string{"q1", "q2", "q3", "q4"}, Options{ID: "reaper", DeadAfter: 5 * time.Second, Log: quiet, Metrics: NewMetrics(prometheus.NewRegistry())})
	r.tick(ctx)
	for q, ids := range map[string][]string{"q1": first, "q2": second, "q4": nil} {
		if got := rdb.LRange(ctx, asynqdb.PendingKey(q), 0, -1).Val(); !slices.Equal(got, ids) {
			t.Errorf("%s: pending %v after one sweep, want %v", q, got, ids)
		}
	}
	if n := rdb.SCard(ctx, heldKey(throttleDefaultPrefix, "q4", "w-cut")).Val(); n != 1 {
		t.Errorf("the worker beating on in q4 holds %d tasks there, want its 1", n)
	}
}
