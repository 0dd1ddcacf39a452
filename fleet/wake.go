package fleet

import (
	"container/heap"
	"context"
	_ "embed"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// Waking: a job deferred to a moment (Wake) has that moment written as its
// retry score, to the millisecond of Redis's clock (wake.lua), and a look
// at the queue when it is due moves the task to the head of the pending
// list, Lead before its moment. Looks come from the worker that deferred
// it, every worker's tick, and the queue's two followers (rendezvous
// hashing over the live workers of hold.lua's beats). Why:
// docs/booking.md, "Waking up".

//go:embed wake.lua
var wakeLua string

var wakeScript = redis.NewScript(wakeLua)

// wakeBatch is the most tasks of a queue one look moves.
const wakeBatch = 100

// wakeTogether is how close two wake-ups are moved by one look: a look for
// a wake-up moves those due within twice that of Redis's clock, so that
// the few ms the clocks' skew is off by do not leave one behind.
const wakeTogether = 10 * time.Millisecond

// writeAfter is how soon after a task is deferred its moment is written
// (wake.lua): once asynq's retry has landed, and together with the others
// deferred meanwhile. Written, the moment is the fleet's: should this
// worker die, the followers wake the task on time.
const writeAfter = 20 * time.Millisecond

// followers is how many live workers follow each queue's next moment.
const followers = 2

// WakeLead is how long before its moment a task is woken when asynq's
// processor looks at an empty queue every poll: the processor's wait (up
// to 1.5 poll, asynq jitters it), and 100 ms for the look, the dequeue and
// the claim's round trip.
func WakeLead(poll time.Duration) time.Duration {
	return poll*3/2 + 100*time.Millisecond
}

// Lead is how long before its moment a task that may come back early for
// it (a booking) asks to be woken (Options.Lead).
func (m *Member) Lead() time.Duration { return m.wake.lead }

// waker is a Member's waking (see above). Its maps are under mu.
type waker struct {
	lead time.Duration
	poke chan struct{}
	skew atomic.Int64 // Redis's clock less this process's, ms, as the last look saw it

	mu      sync.Mutex
	due     map[string]*msHeap          // by queue: when to look (Redis ms)
	moments map[string]map[string]int64 // by queue: tasks deferred, their wake-ups not written yet (Redis ms)
	follow  map[string]bool             // queues this worker follows
	waiting map[string]bool             // queues whose pending list held work at the last look
}

func newWaker(lead time.Duration) *waker {
	return &waker{lead: lead, poke: make(chan struct{}, 1), due: map[string]*msHeap{}, moments: map[string]map[string]int64{},
		follow: map[string]bool{}, waiting: map[string]bool{}}
}

// Wake has task id of queue q woken d from now: call it for a task
// deferred to a moment (a booking, a place in line, a provider's
// Retry-After), which asynq wakes at its own, later, score if no worker
// does. A task that may come back early for its moment (a booking, which
// claims it and sleeps for it) asks to be woken Lead before it.
func (m *Member) Wake(q, id string, d time.Duration) {
	w := m.wake
	now := time.Now().UnixMilli() + w.skew.Load()
	wake := now + d.Milliseconds()
	w.mu.Lock()
	if w.moments[q] == nil {
		w.moments[q] = map[string]int64{}
	}
	w.moments[q][id] = wake
	w.expect(q, min(wake, now+writeAfter.Milliseconds()))
	w.expect(q, wake)
	w.mu.Unlock()
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// Waiting reports whether work waited in the queues, unseen by any worker
// yet, at the last look: a job that books then takes its place rather than
// sleeping for its moment, so that the jobs behind it are seen
// (throttle.Booking.Backlog).
func (m *Member) Waiting() bool {
	w := m.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, yes := range w.waiting {
		if yes {
			return true
		}
	}
	return false
}

// expect has the loop look at queue q at wake (Redis ms). Under mu.
func (w *waker) expect(q string, wake int64) {
	h := w.due[q]
	if h == nil {
		h = &msHeap{}
		w.due[q] = h
	}
	heap.Push(h, wake)
}

// dueQueues returns the queues with a look due at now (this process's
// clock), give or take wakeTogether, and forgets those looks.
func (w *waker) dueQueues(now time.Time) []string {
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
	slices.Sort(qs)
	return qs
}

// until is how long from now (this process's clock) until the next look
// due, at most limit.
func (w *waker) until(now time.Time, limit time.Duration) time.Duration {
	next := limit
	w.mu.Lock()
	for _, h := range w.due {
		if h.Len() > 0 {
			next = min(next, time.Duration((*h)[0]-w.skew.Load()-now.UnixMilli())*time.Millisecond)
		}
	}
	w.mu.Unlock()
	return max(next, 0)
}

// look runs wake.lua on queues qs in one round trip: the moments of the
// tasks deferred there written, what is due moved; with sweep, the live
// workers read too, to choose the followers.
func (m *Member) look(ctx context.Context, qs []string, sweep bool) {
	if len(qs) == 0 {
		return
	}
	w := m.wake
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	alive := int64(0)
	if sweep && m.o.DeadAfter > 0 {
		alive = m.o.DeadAfter.Milliseconds()
	}
	cmds := make([]*redis.Cmd, len(qs))
	sent := make([]map[string]int64, len(qs))
	local := time.Now()
	_, err := m.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range qs {
			args := []any{asynqdb.TaskKeyPrefix(q), wakeBatch, 2 * wakeTogether.Milliseconds(), alive}
			w.mu.Lock()
			sent[i] = w.moments[q]
			delete(w.moments, q)
			w.mu.Unlock()
			for id, at := range sent[i] {
				args = append(args, id, at)
			}
			keys := []string{asynqdb.RetryKey(q), asynqdb.PendingKey(q), beatsKey(m.o.Prefix, q)}
			cmds[i] = wakeScript.EvalSha(ctx, p, keys, args...)
		}
		return nil
	})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		_ = wakeScript.Load(ctx, m.rdb).Err()
	}
	for i, c := range cmds {
		r, rerr := c.Slice()
		m.looked(qs[i], sent[i], r, rerr, sweep, local)
	}
	if err != nil && ctx.Err() == nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
		m.warn("fleet: a look for due tasks failed", qs[0], err)
	}
}

// looked takes in what a look at queue q answered (r, or the error that
// kept it from answering), the moments sent with it given.
func (m *Member) looked(q string, sent map[string]int64, r []any, err error, sweep bool, local time.Time) {
	w := m.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil || len(r) < 6 {
		// Not written: tried again with the next look.
		for id, at := range sent {
			if w.moments[q] == nil {
				w.moments[q] = map[string]int64{}
			}
			if _, newer := w.moments[q][id]; !newer {
				w.moments[q][id] = at
			}
		}
		return
	}
	num := func(v any) int64 { n, _ := v.(int64); return n }
	now, next, more, pending, missing := num(r[0]), num(r[2]), num(r[3]), num(r[4]), int(num(r[5]))
	w.skew.Store(now - local.UnixMilli())
	w.waiting[q] = pending > 0
	for j := 6; j < 6+missing && j < len(r); j++ {
		// Not in the retry set yet (asynq's retry has not landed): again,
		// while its moment is ahead.
		id, _ := r[j].(string)
		if at, ok := sent[id]; ok && at > now {
			if w.moments[q] == nil {
				w.moments[q] = map[string]int64{}
			}
			if _, newer := w.moments[q][id]; !newer {
				w.moments[q][id] = at
			}
			w.expect(q, min(at, now+writeAfter.Milliseconds()))
		}
	}
	if sweep {
		var live []string
		for _, v := range r[min(6+missing, len(r)):] {
			if s, ok := v.(string); ok {
				live = append(live, s)
			}
		}
		w.follow[q] = follows(q, m.o.ID, live)
	}
	if more == 1 {
		w.expect(q, now)
	}
	if next > 0 && w.follow[q] && !w.expecting(q, next) {
		w.expect(q, next)
	}
}

// expecting reports whether a look at queue q is due by at already. Under
// mu.
func (w *waker) expecting(q string, at int64) bool {
	h := w.due[q]
	return h != nil && h.Len() > 0 && (*h)[0] <= at
}

// follows reports whether worker id is one of the followers of queue q
// among the live workers: the ones whose hash with q ranks first. With no
// worker known alive (no signs of life kept: hand-over off), every worker
// follows.
func follows(q, id string, live []string) bool {
	if len(live) == 0 {
		return true
	}
	rank := func(w string) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(q + "\x00" + w))
		return h.Sum64()
	}
	mine := rank(id)
	above := 0
	for _, w := range live {
		if w != id && rank(w) > mine {
			above++
		}
	}
	return above < followers
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
