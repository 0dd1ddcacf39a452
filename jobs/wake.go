package jobs

import (
	"container/heap"
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
// at the head of their queue: a job booked for x is noted in its queue's
// wake set at x − Lead, and the worker's Waker moves the note when it is
// due (every worker's Waker also moves any note due, every WakeEvery, for
// the notes of workers that died). The job then claims x and sleeps about
// Lead (0.25 s with the default poll_interval), a sixth of the handler
// time; it is picked up before the work queued behind it, which it was
// booked ahead of. asynq still holds a wake-up of its own for the job, a
// second after the Waker's (see Throttle.booked): a fleet with no Waker
// running wakes it that way, late, and the job books again.

//go:embed wake.lua
var wakeSource string

var wakeScript = redis.NewScript(wakeSource)

// wakeBatch is the most tasks of a queue one wake call moves.
const wakeBatch = 100

// WakeEvery is how often a Waker looks at every queue, for the wake-ups
// other workers noted and did not move (they died, or restarted). Its own
// it moves when they are due.
const WakeEvery = time.Second

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
	rdb    redis.UniversalClient
	prefix string
	queues []string
	lead   time.Duration
	every  time.Duration // WakeEvery, but in tests
	poke   chan struct{}

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
	return &Waker{rdb: rdb, prefix: prefix, queues: queues, lead: lead, every: WakeEvery, poke: make(chan struct{}, 1), due: map[string]*msHeap{}}
}

// wakeKey is queue q's wake set, "<prefix>wake:{q}": asynq's hash tag for
// q, as it is (asynq's keys do not escape it), so that one script can move
// a task from the queue's retry set to its pending list on a cluster.
func wakeKey(prefix, q string) string { return prefix + "wake:{" + q + "}" }

// note notes that task id of queue q is to be woken for moment at (on
// Redis's clock): at − Lead.
func (w *Waker) note(ctx context.Context, q, id string, at time.Time) error {
	wake := at.Add(-w.lead).UnixMilli()
	if err := w.rdb.ZAdd(ctx, wakeKey(w.prefix, q), redis.Z{Score: float64(wake), Member: id}).Err(); err != nil {
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

// Run moves due wake-ups until ctx ends: those this worker noted when they
// are due, and every WakeEvery whatever is due in any queue.
func (w *Waker) Run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
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
		qs := w.queues
		if now.Before(every) {
			qs = w.dueQueues(now)
		} else {
			w.dueQueues(now)
			every = now.Add(w.every)
		}
		if len(qs) > 0 {
			w.look(ctx, qs)
		}
		timer.Reset(w.untilNext(time.Now(), every))
	}
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

// look moves what is due in queues qs, in one round trip. A queue with
// more due than one call moves, or a wake-up kept for a task still active,
// is looked at again soon.
func (w *Waker) look(ctx context.Context, qs []string) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if !w.loaded {
		if err := wakeScript.Load(ctx, w.rdb).Err(); err != nil {
			return
		}
		w.loaded = true
	}
	cmds := make([]*redis.Cmd, len(qs))
	local := time.Now()
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range qs {
			cmds[i] = wakeScript.EvalSha(ctx, p, []string{wakeKey(w.prefix, q), asynqdb.RetryKey(q), asynqdb.PendingKey(q)},
				asynqdb.TaskKeyPrefix(q), wakeBatch, 2*wakeTogether.Milliseconds(), wakeActive.Milliseconds())
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
		if len(r) != 3 {
			continue
		}
		w.skew.Store(r[1] - local.UnixMilli())
		switch {
		case r[0] == wakeBatch:
			w.expect(qs[i], r[1])
		case r[2] > 0:
			w.expect(qs[i], r[1]+wakeTogether.Milliseconds())
		}
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
