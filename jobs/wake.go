package jobs

import (
	"container/heap"
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/throttle"
)

// asynq wakes a deferred task to the second at best: it keeps the moment in
// whole seconds of the worker's clock and its forwarder looks every second,
// onto the tail of the queue, behind whatever waits there. A booked job
// woken that way must be woken early (wakeEarly) and then sleeps for its
// moment in one of the worker's handlers, about 1.5 s on average: a
// provider at R messages a second keeps 1.5·R handlers asleep across the
// fleet, and with fewer the jobs behind the sleepers (a backlog's first
// pass, a tenant's first jobs) wait in the gaps.
//
// A Waker wakes booked jobs itself, on Redis's clock to the millisecond,
// at the head of their queue: a job booked for x is noted at x − Lead in
// its worker's wake set of the queue, and the worker's Waker moves the note
// when it is due. The job then claims x and sleeps about Lead (0.25 s with
// the default poll_interval), a sixth of the handler time; it is picked up
// before the work queued behind it, which it was booked ahead of. asynq
// still holds a wake-up of its own for the job, a second after the Waker's
// (see Throttle.booked): a fleet with no Waker running wakes it that way,
// late, and the job books again.
//
// Every WakeEvery each Waker also sweeps every queue: it shows it is alive
// in the queue's owners set, moves whatever is due in any worker's set
// (a worker stopped or too busy to move its own), and adopts the set of a
// worker that has not swept for orphanAfter (killed, or gone): from then on
// it moves those wake-ups when due, as its own; until then (suspectAfter)
// it moves what such a worker's set holds due before its next sweep, early.
// Without adoption a killed worker's wake-ups were found only by the
// sweeps, up to a second late, and their jobs booked again at the end of
// their recipients' lines: a third of the chaos run's waiting work after
// each kill, and half its rate.

//go:embed wake.lua
var wakeSource string

var wakeScript = redis.NewScript(wakeSource)

// wakeBatch is the most tasks of a queue one wake call moves.
const wakeBatch = 100

// WakeEvery is how often a Waker sweeps every queue (see above). Its own
// wake-ups it moves when they are due.
const WakeEvery = time.Second

// suspectAfter is how long, in WakeEvery, a Waker may go without a sweep
// before the next worker to sweep moves what its set holds due within the
// next WakeEvery, early (its jobs claim their moments and sleep for them),
// rather than late at the sweep after: it missed a sweep, stopped or killed.
const suspectAfter = 1.1

// orphanAfter is how long, in WakeEvery, a Waker may go without a sweep
// before its wake-ups are adopted by the next worker to sweep that has not
// been silent as long itself (so not after Redis was down). One sweep
// missed by half a period is enough: a worker stopped that long (SIGSTOP,
// a long GC pause) loses its wake-ups to another, which then moves them
// when due, and its own later looks find them gone; the wake-ups due before
// the adoption are moved by the sweeps, late.
const orphanAfter = 1.5

// wakeTogether is how close two wake-ups are moved by one look, and how
// soon a wake-up kept for a task still active is looked at again. A look
// for a wake-up moves those due within twice that of Redis's clock, so
// that the few ms the skew between the clocks is off by do not leave one
// behind until the next look at every queue.
const wakeTogether = 10 * time.Millisecond

// wakeActive is how long after it is due a wake-up waits for its task to
// leave active (see wake.lua): asynq's Retry follows the handler's return
// within milliseconds.
const wakeActive = time.Second

// Waker wakes booked jobs at their moment (see above). Run it in every
// worker; a Throttle with a Waker notes each booked job's wake-up in it.
type Waker struct {
	// Log, if set, hears of the wake-ups adopted from a worker gone.
	Log *slog.Logger

	rdb    redis.UniversalClient
	prefix string
	id     string // this Waker's, unique: it names its wake sets
	queues []string
	lead   time.Duration
	every  time.Duration // WakeEvery, but in tests
	poke   chan struct{}
	// left says Run has ended: a wake-up noted since (a handler still
	// running in the shutdown) marks the set for adoption.
	left atomic.Bool
	// listed holds the queues w listed itself in as an owner with its first
	// note there (its sweeps list it too; under mu).
	listed map[string]bool

	mu  sync.Mutex
	due map[string]*msHeap // by queue, the wake-ups this worker noted (Redis's clock, ms)
	// skew is Redis's clock less this process's, as the last look saw it
	// (ms): the wake-ups are on Redis's clock.
	skew atomic.Int64
	// loaded says the script is loaded (Run's goroutine only).
	loaded bool
}

// WakeLead is how long before its moment a Waker wakes a booked job when
// asynq's processor looks at an empty queue every poll: the processor's
// wait (up to 1.5 poll, asynq jitters it), and 100 ms for the look, the
// dequeue and the claim's round trip.
func WakeLead(poll time.Duration) time.Duration {
	return poll*3/2 + 100*time.Millisecond
}

// NewWaker returns a Waker of queues on rdb (asynq's Redis; its notes are
// kept there, under prefix (throttle.DefaultPrefix if empty), in each
// queue's hash slot), waking jobs lead before their moment. Call Run to
// start it.
func NewWaker(rdb redis.UniversalClient, prefix string, queues []string, lead time.Duration) *Waker {
	if prefix == "" {
		prefix = throttle.DefaultPrefix
	}
	return &Waker{rdb: rdb, prefix: prefix, id: uuid.NewString(), queues: queues, lead: lead, every: WakeEvery,
		poke: make(chan struct{}, 1), due: map[string]*msHeap{}, listed: map[string]bool{}}
}

// A queue's keys carry asynq's hash tag for the queue, as it is (asynq's
// keys do not escape it), so that one script can move a task from the
// queue's retry set to its pending list on a cluster.

// sharedWakeKey is queue q's one wake set of the workers before owners,
// "<prefix>wake:{q}": a sweep moves what is due in it.
func sharedWakeKey(prefix, q string) string { return prefix + "wake:{" + q + "}" }

// ownersKey is queue q's set of Wakers by their last sweep (Unix ms).
func ownersKey(prefix, q string) string { return prefix + "wake:{" + q + "}:owners" }

// notesPrefix starts the name of each Waker's wake set of queue q; its ID
// ends it.
func notesPrefix(prefix, q string) string { return prefix + "wake:{" + q + "}:w:" }

// notesKey is the wake set of queue q that w notes its wake-ups in.
func (w *Waker) notesKey(q string) string { return notesPrefix(w.prefix, q) + w.id }

// note notes that task id of queue q is to be woken for moment at (on
// Redis's clock): at − Lead.
func (w *Waker) note(ctx context.Context, q, id string, at time.Time) error {
	wake := at.Add(-w.lead).UnixMilli()
	w.mu.Lock()
	first := !w.listed[q]
	w.listed[q] = true
	w.mu.Unlock()
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, w.notesKey(q), redis.Z{Score: float64(wake), Member: id})
		switch {
		case w.left.Load():
			// Run has ended: the next worker to sweep adopts the set.
			p.ZAdd(ctx, ownersKey(w.prefix, q), redis.Z{Score: 0, Member: w.id})
		case first:
			// Listed before its first sweep, should it die before.
			beat := time.Now().UnixMilli() + w.skew.Load()
			p.ZAdd(ctx, ownersKey(w.prefix, q), redis.Z{Score: float64(beat), Member: w.id})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("jobs: note the wake-up of %s: %w", id, err)
	}
	w.expect(q, wake)
	return nil
}

// expect has Run look at queue q at wake (Redis's clock, ms).
func (w *Waker) expect(q string, wake int64) {
	w.mu.Lock()
	h := w.due[q]
	if h == nil {
		h = &msHeap{}
		w.due[q] = h
	}
	heap.Push(h, wake)
	w.mu.Unlock()
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// Run moves due wake-ups until ctx ends: those of this worker's sets when
// they are due, and every WakeEvery it sweeps every queue (see above). When
// ctx ends, its sets are left to the next worker to sweep.
func (w *Waker) Run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	defer w.leave(context.WithoutCancel(ctx))
	every := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-w.poke:
			timer.Stop()
		}
		now := time.Now()
		if now.Before(every) {
			if qs := w.dueQueues(now); len(qs) > 0 {
				w.look(ctx, qs, false)
			}
		} else {
			w.dueQueues(now)
			every = now.Add(w.every)
			w.look(ctx, w.queues, true)
		}
		timer.Reset(w.untilNext(time.Now(), every))
	}
}

// leave marks w's sets for adoption by the next worker to sweep.
func (w *Waker) leave(ctx context.Context) {
	w.left.Store(true)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, _ = w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, q := range w.queues {
			p.ZAddXX(ctx, ownersKey(w.prefix, q), redis.Z{Score: 0, Member: w.id})
		}
		return nil
	})
}

// dueQueues returns the queues with a wake-up of this worker's due at now
// (this process's clock), give or take wakeTogether, and forgets those.
func (w *Waker) dueQueues(now time.Time) []string {
	by := now.UnixMilli() + w.skew.Load() + wakeTogether.Milliseconds()
	var qs []string
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, h := range w.due {
		if h.Len() == 0 || (*h)[0] > by {
			continue
		}
		for h.Len() > 0 && (*h)[0] <= by {
			heap.Pop(h)
		}
		qs = append(qs, q)
	}
	return qs
}

// untilNext is how long from now (this process's clock) until the next
// wake-up this worker noted, or until every, whichever comes first.
func (w *Waker) untilNext(now, every time.Time) time.Duration {
	next := every.Sub(now)
	w.mu.Lock()
	for _, h := range w.due {
		if h.Len() > 0 {
			next = min(next, time.Duration((*h)[0]-w.skew.Load()-now.UnixMilli())*time.Millisecond)
		}
	}
	w.mu.Unlock()
	return max(next, 0)
}

// look moves what is due in w's sets of queues qs, or sweeps them, in one
// round trip. A queue with more due than one call moves, or a wake-up kept
// for a task still active, is looked at again soon; the next wake-up of
// w's set is looked at when due (one adopted, or one of its own this
// process did not note: the chain of looks follows the set).
func (w *Waker) look(ctx context.Context, qs []string, sweep bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if !w.loaded {
		if err := wakeScript.Load(ctx, w.rdb).Err(); err != nil {
			return
		}
		w.loaded = true
	}
	mode := "look"
	if sweep {
		mode = "sweep"
	}
	cmds := make([]*redis.Cmd, len(qs))
	local := time.Now()
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range qs {
			keys := []string{w.notesKey(q), asynqdb.RetryKey(q), asynqdb.PendingKey(q), ownersKey(w.prefix, q), sharedWakeKey(w.prefix, q)}
			cmds[i] = wakeScript.EvalSha(ctx, p, keys, mode, asynqdb.TaskKeyPrefix(q), wakeBatch, 2*wakeTogether.Milliseconds(),
				wakeActive.Milliseconds(), w.id, notesPrefix(w.prefix, q), w.periods(orphanAfter), w.periods(suspectAfter), w.periods(1))
		}
		return nil
	})
	if err != nil {
		// A Redis restarted, or a failover, forgets the script.
		w.loaded = !redis.HasErrorPrefix(err, "NOSCRIPT")
		return
	}
	for i, c := range cmds {
		r, _ := c.Int64Slice()
		if len(r) != 6 {
			continue
		}
		now, kept, next, more, adopted := r[1], r[2], r[3], r[4], r[5]
		if adopted > 0 && w.Log != nil {
			w.Log.Info("adopted the wake-ups of a worker that stopped sweeping", "queue", qs[i], "wakeups", adopted)
		}
		w.skew.Store(now - local.UnixMilli())
		switch {
		case more == 1:
			w.expect(qs[i], now)
		case kept > 0:
			w.expect(qs[i], now+wakeTogether.Milliseconds())
		}
		if next > now+2*wakeTogether.Milliseconds() {
			w.expectBy(qs[i], next)
		}
	}
}

// periods is n WakeEvery (w.every) in ms.
func (w *Waker) periods(n float64) int64 { return int64(n * float64(w.every.Milliseconds())) }

// expectBy has Run look at queue q by wake (Redis's clock, ms): at wake,
// unless a look is due before it (that look follows the chain).
func (w *Waker) expectBy(q string, wake int64) {
	w.mu.Lock()
	h := w.due[q]
	ahead := h != nil && h.Len() > 0 && (*h)[0] <= wake
	w.mu.Unlock()
	if !ahead {
		w.expect(q, wake)
	}
}

// msHeap is a min-heap of Unix ms.
type msHeap []int64

func (h msHeap) Len() int           { return len(h) }
func (h msHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h msHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *msHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *msHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// scaled is a wake-up (Unix ms) of w's, its job's moment scaled around now
// by k (as throttle.Scale scales it), and asynq's wake-up for it, a Unix
// second: the second after the Waker's.
func (w *Waker) scaled(wake float64, now time.Time, k float64) (newWake, score int64) {
	at := time.UnixMilli(int64(wake)).Add(w.lead)
	newWake = throttle.Scale(at, now, k).Add(-w.lead).UnixMilli()
	return newWake, newWake/1000 + 1
}

// noted is a task's wake-up (Unix ms) and the wake set that holds it.
type noted struct {
	key  string
	wake float64
}

// notesOf reads every wake-up noted in queue q's wake sets (each owner's,
// and the shared set of the workers before owners), by task ID.
func (w *Waker) notesOf(ctx context.Context, q string) (map[string]noted, error) {
	owners, err := w.rdb.ZRange(ctx, ownersKey(w.prefix, q), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("jobs: read the wake-ups of %s: %w", q, err)
	}
	keys := []string{sharedWakeKey(w.prefix, q)}
	for _, o := range owners {
		keys = append(keys, notesPrefix(w.prefix, q)+o)
	}
	notes := map[string]noted{}
	for _, key := range keys {
		for start := int64(0); ; start += repaceBatch {
			z, err := w.rdb.ZRangeWithScores(ctx, key, start, start+repaceBatch-1).Result()
			if err != nil {
				return nil, fmt.Errorf("jobs: read the wake-ups in %s: %w", key, err)
			}
			for _, e := range z {
				notes[e.Member.(string)] = noted{key: key, wake: e.Score}
			}
			if len(z) < repaceBatch {
				break
			}
		}
	}
	return notes, nil
}
