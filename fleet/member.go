// Package fleet is what each worker does for the whole fleet, beside its
// own tasks, on asynq's Redis: it shows that it is alive, it hands a dead
// worker's tasks to the others, and it wakes the tasks waiting for a moment
// at that moment (wake.go). One liveness record serves all of it: each
// worker's signs of life in each queue it serves (hold.lua's beats).
//
// Each worker beats every DeadAfter/5, records the tasks it holds in a set
// of its own per queue, and reaps: a worker silent for DeadAfter by Redis's
// clock is dead, and its tasks go back to the head of their queue. Holds
// tells a worker back from a long silence which of its tasks went to
// another. Why and how soon: docs/design.md, "Dead workers". What the
// package relies on of asynq's Redis layout is listed in internal/asynqdb.
package fleet

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/coalesce"
	"github.com/notify-throttle/throttler/throttle"
)

var (
	//go:embed hold.lua
	holdLua    string
	holdScript = redis.NewScript(holdLua)
	//go:embed reap.lua
	reapLua    string
	reapScript = redis.NewScript(reapLua)
)

// leaseHeartbeat is how often asynq extends the leases of the tasks a
// server runs (item 1 of the contract in internal/asynqdb): an active task
// no worker holds whose lease went unextended for DeadAfter and this long
// is nobody's, and is handed over as a dead worker's are (reap.lua).
const leaseHeartbeat = 5 * time.Second

// DefaultDeadAfter is how long a worker may show no sign of life before its
// tasks are handed over, unless Options.DeadAfter says otherwise.
const DefaultDeadAfter = 5 * time.Second

// ErrHandedOver is Holds' answer for a task this worker no longer holds:
// it was silent for Options.DeadAfter, and the task went back to its queue
// for another worker.
var ErrHandedOver = errors.New("fleet: task handed over to another worker while this one showed no sign of life")

// Options configure a Member. The zero value of each field is its default.
type Options struct {
	// DeadAfter is how long a worker may show no sign of life in Redis
	// before another takes it for dead and hands its tasks over. A worker
	// shows one every DeadAfter/5. Default DefaultDeadAfter; negative:
	// no hand-over (no signs of life, no held tasks, no reaping), only
	// the waking, every queue swept each second.
	DeadAfter time.Duration
	// Lead is how long before its moment a task is woken (Wake): see
	// WakeLead. Default WakeLead(100 ms), asynq's poll interval's.
	Lead time.Duration
	// Prefix starts every key, as the throttle's. Default
	// throttle.DefaultPrefix.
	Prefix string
	// ID names this worker. Default "<host>/<pid>/<random>".
	ID string
	// Log gets one line per recovery. Default slog.Default().
	Log *slog.Logger
	// Metrics, if set, counts recoveries (NewMetrics).
	Metrics *Metrics
}

// Member is one worker's part: its signs of life, the tasks it holds,
// the reaper, and the waking. Build it with New; its methods are safe for
// concurrent use.
type Member struct {
	rdb    redis.UniversalClient
	one    coalesce.Processor // take's SADD: rdb's auto-pipeliner on one node
	queues []string
	o      Options
	start  time.Time // for the monotonic times in lastSign

	mu       sync.Mutex
	warned   time.Time           // when loop last logged a failure
	finished map[string][]string // queue -> members (runs) ended since the last beat
	taken    map[string]run      // queue+"\x00"+task -> the run holding it
	runs     uint64              // runs taken so far: the n of each member

	// signs holds, per queue, the times (since start) the latest sign of
	// life was sent and the latest sign that ended a silence long enough
	// for the worker to have been taken for dead.
	signs map[string]*signs

	wake *waker
}

// signs are a queue's sign-of-life times, in ns since Member.start.
type signs struct {
	last, afterGap atomic.Int64
}

// run is one run of a task by this worker: its member of the held set
// ("<task ID>:<n>", see hold.lua) and when its take was sent, since start.
type run struct {
	member string
	at     time.Duration
}

// New returns the part in the fleet of a worker serving queues.
func New(rdb redis.UniversalClient, queues []string, o Options) *Member {
	if o.DeadAfter == 0 {
		o.DeadAfter = DefaultDeadAfter
	}
	if o.Lead <= 0 {
		o.Lead = WakeLead(100 * time.Millisecond)
	}
	if o.Prefix == "" {
		o.Prefix = throttle.DefaultPrefix
	}
	if o.ID == "" {
		host, _ := os.Hostname()
		o.ID = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	r := &Member{rdb: rdb, one: coalesce.Of(rdb), queues: queues, o: o, start: time.Now(),
		finished: map[string][]string{}, taken: map[string]run{}, signs: map[string]*signs{}, wake: newWaker(o.Lead)}
	for _, q := range queues {
		r.signs[q] = &signs{}
		r.signs[q].afterGap.Store(-int64(o.DeadAfter)) // a start is not a return from a silence
	}
	return r
}

// Run beats, reaps and wakes until ctx ends, then drops what the worker
// held and leaves the beats. Cancel ctx only once the asynq server has shut
// down: a worker whose handlers still run must keep beating (and its
// handlers deferring).
func (r *Member) Run(ctx context.Context) error {
	r.loop(ctx)
	if r.o.DeadAfter < 0 {
		return nil
	}
	leave, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, q := range r.queues {
		if err := r.beat(leave, q, "leave"); err != nil {
			r.o.Log.Warn("fleet: could not leave", "queue", q, "err", err)
		}
	}
	return nil
}

// every is the loop's tick: a sign of life in every queue, a reap and a
// sweep of each.
func (r *Member) every() time.Duration {
	if r.o.DeadAfter > 0 {
		return r.o.DeadAfter / 5
	}
	return time.Second
}

// loop ticks until ctx ends, and between ticks looks at the queues when
// their waiting tasks come due.
func (r *Member) loop(ctx context.Context) {
	tick := time.NewTicker(r.every())
	defer tick.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.tick(ctx)
		if !r.lookUntilTick(ctx, tick, timer) {
			return
		}
	}
}

// tick shows this worker's signs of life in every queue and reaps it (with
// hand-over), and sweeps every queue for due tasks.
func (r *Member) tick(ctx context.Context) {
	if r.o.DeadAfter > 0 {
		var all, found []Handover
		var judged, dead []string
		reap := func(q string, known []string) []Handover {
			hs, err := r.reap(ctx, q, known)
			if err != nil && ctx.Err() == nil {
				r.warn("fleet: a reap failed", q, err)
			}
			all = append(all, hs...)
			return hs
		}
		for _, q := range r.queues {
			if err := r.beat(ctx, q, "beat"); err != nil && ctx.Err() == nil {
				r.warn("fleet: a sign of life failed", q, err)
			}
			if r.mayReap(q) {
				judged = append(judged, q)
				found = append(found, reap(q, nil)...)
			}
		}
		// A worker found dead in one queue is dead in the others it is
		// silent in too (reap.lua), the ones judged before it included.
		for _, h := range found {
			if h.Worker != "" && !slices.Contains(dead, h.Worker) {
				dead = append(dead, h.Worker)
			}
		}
		if len(dead) > 0 && len(judged) > 1 {
			for _, q := range judged {
				reap(q, dead)
			}
		}
		r.report(all)
	}
	r.wake.dueQueues(time.Now()) // the sweep looks at them all
	r.look(ctx, r.queues, true)
}

// lookUntilTick looks at the queues whose waiting tasks come due until the
// next tick (true) or until ctx ends (false).
func (r *Member) lookUntilTick(ctx context.Context, tick *time.Ticker, timer *time.Timer) bool {
	for {
		timer.Reset(r.wake.until(time.Now(), r.every()))
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			return true
		case <-timer.C:
			r.look(ctx, r.wake.dueQueues(time.Now()), false)
		case <-r.wake.poke:
		}
	}
}

// warn logs a failure of the loop, at most once a minute: Redis being
// unreachable is logged by the client's guard, but a denied command (an
// ACL without the commands config.yaml lists) would otherwise go unseen.
func (r *Member) warn(msg, q string, err error) {
	r.mu.Lock()
	quiet := time.Since(r.warned) < time.Minute
	if !quiet {
		r.warned = time.Now()
	}
	r.mu.Unlock()
	if !quiet {
		r.o.Log.Warn(msg, "queue", q, "err", err)
	}
}

// mayReap reports whether this worker may judge others in queue q: it
// shows signs of life there now, and has without a gap for DeadAfter. A
// worker back from a silence of its own (Redis restarting or unreachable,
// the worker paused) waits: the others were likely as silent as it was,
// and need time to show that they are alive.
func (r *Member) mayReap(q string) bool {
	s, ok := r.signs[q]
	if !ok {
		return false
	}
	now := time.Since(r.start)
	return r.fresh(s, now) && now-time.Duration(s.afterGap.Load()) >= r.o.DeadAfter
}

// fresh reports whether this worker has shown a sign of life in s's queue
// less than DeadAfter/2 before now: it cannot be taken for dead before its
// next.
func (r *Member) fresh(s *signs, now time.Duration) bool {
	last := s.last.Load()
	return last > 0 && now-time.Duration(last) < r.o.DeadAfter/2
}

// beat runs hold.lua's beat or leave for queue q, with the tasks ended since
// the last one; on failure they wait for the next.
func (r *Member) beat(ctx context.Context, q, mode string) error {
	r.mu.Lock()
	ended := r.finished[q]
	r.finished[q] = nil
	r.mu.Unlock()
	if _, _, err := r.hold(ctx, q, mode, ended...); err != nil {
		r.mu.Lock()
		r.finished[q] = append(r.finished[q], ended...)
		r.mu.Unlock()
		return err
	}
	return nil
}

// hold runs hold.lua's mode on queue q with members, notes the sign of
// life it gave, and returns when the call was sent (since start).
func (r *Member) hold(ctx context.Context, q, mode string, members ...string) (bool, time.Duration, error) {
	args := make([]any, 0, 2+len(members))
	args = append(args, r.o.ID, mode)
	for _, m := range members {
		args = append(args, m)
	}
	sent := time.Since(r.start)
	n, err := holdScript.Run(ctx, r.rdb, []string{heldKey(r.o.Prefix, q, r.o.ID), beatsKey(r.o.Prefix, q)}, args...).Int()
	if err != nil {
		return false, sent, fmt.Errorf("fleet: %s: %w", mode, err)
	}
	if s, ok := r.signs[q]; ok && n == 1 {
		s.note(int64(sent), int64(r.o.DeadAfter/2))
	}
	return n == 1, sent, nil
}

// note records a sign sent at t; one that follows the latest by half or
// more of DeadAfter ends a silence after which the worker may have been
// taken for dead. Signs sent at once may be noted out of order.
func (s *signs) note(t, half int64) {
	for {
		prev := s.last.Load()
		if t <= prev {
			return
		}
		if s.last.CompareAndSwap(prev, t) {
			if t-prev >= half {
				s.afterGap.Store(t)
			}
			return
		}
	}
}

// Middleware records that this worker holds each task while next runs it.
// A task it could not record (Redis unreachable) still runs; it then goes
// back to its queue only through asynq's own recovery if the worker dies.
func (r *Member) Middleware(next asynq.Handler) asynq.Handler {
	if r.o.DeadAfter < 0 {
		return next // no hand-over: nothing to record
	}
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		q, _ := asynq.GetQueueName(ctx)
		key := q + "\x00" + id
		r.mu.Lock()
		r.runs++
		member := id + ":" + strconv.FormatUint(r.runs, 10)
		r.mu.Unlock()
		at, err := r.take(ctx, q, member)
		if err != nil {
			r.o.Log.Warn("fleet: could not record the task as held", "task", id, "queue", q, "err", err)
			return next.ProcessTask(ctx, task)
		}
		r.mu.Lock()
		r.taken[key] = run{member: member, at: at}
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			delete(r.taken, key)
			r.finished[q] = append(r.finished[q], member)
			r.mu.Unlock()
		}()
		return next.ProcessTask(ctx, task)
	})
}

// take records that this worker holds member in queue q, and returns when
// the record was sent (since start). While the worker's signs of life there
// are fresh it cannot be taken for dead before its next, and one SADD
// does; after a silence, hold.lua's take is a sign of life as well.
func (r *Member) take(ctx context.Context, q, member string) (time.Duration, error) {
	sent := time.Since(r.start)
	if s, ok := r.signs[q]; ok && r.fresh(s, sent) {
		if err := r.one.Process(ctx, redis.NewIntCmd(ctx, "sadd", heldKey(r.o.Prefix, q, r.o.ID), member)); err != nil {
			return sent, fmt.Errorf("fleet: take: %w", err)
		}
		return sent, nil
	}
	_, sent, err := r.hold(ctx, q, "take", member)
	return sent, err
}

// Holds returns nil if this worker still holds the task of ctx (an asynq
// handler's context, inside Middleware), ErrHandedOver if the task went to
// another worker (or was never recorded as held), or the error that kept it
// from knowing. A worker whose signs of life in the task's queue, since it
// took the task and until now, were never DeadAfter/2 apart cannot have
// been taken for dead, and Holds then answers without asking Redis;
// otherwise it asks, and a yes is a sign of life.
func (r *Member) Holds(ctx context.Context) error {
	if r.o.DeadAfter < 0 {
		return nil // no hand-over: every task is this worker's
	}
	id, _ := asynq.GetTaskID(ctx)
	q, _ := asynq.GetQueueName(ctx)
	r.mu.Lock()
	taken, ok := r.taken[q+"\x00"+id]
	r.mu.Unlock()
	if !ok {
		return r.handedOver()
	}
	if s := r.signs[q]; s != nil && r.fresh(s, time.Since(r.start)) && time.Duration(s.afterGap.Load()) <= taken.at {
		return nil
	}
	held, _, err := r.hold(ctx, q, "keep", taken.member)
	switch {
	case err != nil:
		return err
	case !held:
		return r.handedOver()
	}
	return nil
}

// handedOver counts a task this worker found it no longer holds, and
// returns ErrHandedOver.
func (r *Member) handedOver() error {
	if r.o.Metrics != nil {
		r.o.Metrics.HandedOver.Inc()
	}
	return ErrHandedOver
}

// Handover is what one reap did with one dead worker's tasks in a queue,
// or with the orphans: active tasks no worker held (see reap.lua).
type Handover struct {
	Queue string
	// Worker is the dead worker's ID; "" for the orphans.
	Worker string
	// Silent is how long the worker had shown no sign of life, by Redis's
	// clock: an upper bound of the time from its death to the hand-over.
	// For the orphans, how long their leases had not been extended, at
	// least.
	Silent time.Duration
	// Tasks are the IDs of the tasks moved back to the queue.
	Tasks []string
}

// Reap hands the tasks of queue q's dead workers back to the queue, counts
// each recovery by q's queue (a shard's counts as its queue's: see
// asynqdb.Shard), and returns what it did.
func (r *Member) Reap(ctx context.Context, q string) ([]Handover, error) {
	return r.reap(ctx, q, nil)
}

// reap is Reap, with the workers found dead in other queues in the same
// sweep taken as dead in q too.
func (r *Member) reap(ctx context.Context, q string, dead []string) ([]Handover, error) {
	keys := []string{beatsKey(r.o.Prefix, q), asynqdb.ActiveKey(q), asynqdb.LeaseKey(q), asynqdb.PendingKey(q)}
	args := []any{r.o.DeadAfter.Milliseconds(), asynqdb.TaskKeyPrefix(q),
		heldPrefix(r.o.Prefix, q), int64(math.Ceil((r.o.DeadAfter + leaseHeartbeat).Seconds()))}
	for _, w := range dead {
		args = append(args, w)
	}
	res, err := reapScript.Run(ctx, r.rdb, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet: reap %s: %w", q, err)
	}
	hs, err := parseReap(q, res)
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		if m := r.o.Metrics; m != nil && len(h.Tasks) > 0 {
			m.Recovered.WithLabelValues(asynqdb.BaseQueue(q)).Add(float64(len(h.Tasks)))
			if h.Worker != "" {
				m.Handover.Observe(h.Silent.Seconds())
			}
		}
	}
	return hs, nil
}

// report logs one tick's recoveries: one line per dead worker (or for the
// orphans) and queue, however many shards of the queue it held tasks in.
func (r *Member) report(hs []Handover) {
	type key struct{ worker, queue string }
	byKey := map[key]*Handover{}
	var order []key
	for _, h := range hs {
		if len(h.Tasks) == 0 {
			continue
		}
		k := key{h.Worker, asynqdb.BaseQueue(h.Queue)}
		sum := byKey[k]
		if sum == nil {
			sum = &Handover{Queue: k.queue, Worker: h.Worker}
			byKey[k] = sum
			order = append(order, k)
		}
		sum.Silent = max(sum.Silent, h.Silent)
		sum.Tasks = append(sum.Tasks, h.Tasks...)
	}
	for _, k := range order {
		h := byKey[k]
		if h.Worker == "" {
			r.o.Log.Warn("recovered active tasks no worker held", "queue", h.Queue, "unextended", h.Silent,
				"tasks", len(h.Tasks), "first", h.Tasks[0], "by", r.o.ID)
			continue
		}
		r.o.Log.Warn("recovered the tasks of a dead worker", "worker", h.Worker, "queue", h.Queue,
			"silent", h.Silent, "tasks", len(h.Tasks), "first", h.Tasks[0], "by", r.o.ID)
	}
}

// parseReap reads reap.lua's reply.
func parseReap(q string, res []any) ([]Handover, error) {
	var hs []Handover
	for i := 0; i < len(res); {
		if i+3 > len(res) {
			return nil, fmt.Errorf("fleet: unexpected reap reply %v", res)
		}
		w, _ := res[i].(string)
		ms, _ := res[i+1].(int64)
		n, _ := res[i+2].(int64)
		i += 3
		if int64(len(res)-i) < n {
			return nil, fmt.Errorf("fleet: unexpected reap reply %v", res)
		}
		h := Handover{Queue: q, Worker: w, Silent: time.Duration(ms) * time.Millisecond}
		for _, id := range res[i : i+int(n)] {
			s, _ := id.(string)
			h.Tasks = append(h.Tasks, s)
		}
		i += int(n)
		hs = append(hs, h)
	}
	return hs, nil
}

// Metrics are the recovery's Prometheus metrics.
type Metrics struct {
	Recovered  *prometheus.CounterVec // tasks handed over from dead workers, by queue
	Handover   prometheus.Histogram   // seconds from a dead worker's last sign of life to the hand-over
	HandedOver prometheus.Counter     // tasks this worker found handed over when it came back
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Recovered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "recovered_tasks_total",
			Help: "Tasks of dead workers handed back to their queue by this worker's reaper."}, []string{"queue"}),
		Handover: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "throttler", Name: "recovery_seconds",
			Help:    "Time from a dead worker's last sign of life to the hand-over of its tasks, per recovery.",
			Buckets: []float64{1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 20, 30, 60, 120}}),
		HandedOver: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "throttler", Name: "handed_over_total",
			Help: "Tasks this worker found handed over to another worker after a silence: not sent here."}),
	}
	reg.MustRegister(m.Recovered, m.Handover, m.HandedOver)
	return m
}
