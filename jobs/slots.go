package jobs

import (
	"context"
	"sync"
	"sync/atomic"
)

// Booked jobs wake a little before their moment (asynq wakes a task to the
// second: see wakeEarly) and sleep the rest in the worker, 1.5 s on
// average. Each sleeping job holds one of asynq's handler slots, so a
// worker whose concurrency is below its providers' rate x 1.5 s fills its
// slots with sleepers, and the work queued behind them (a tenant's first
// jobs, a first pass through a backlog) is reached only in the gaps: 2
// workers of 20 at a 100/s provider sent 22/s in the first 5 s of a 2,000
// backlog.
//
// WorkSlots keeps the two apart. asynq runs concurrency + sleep_slots
// handlers (cmd/worker); each job takes one of concurrency work slots
// before it does anything, and gives it back while it sleeps for its
// moment, so that sleeping jobs use only the sleep slots and concurrency
// bounds the jobs that work. A job that waits for a work slot is work no
// worker has seen yet, as one in the queues is (Backlog): a job booking
// meanwhile takes a place in its tenant's line rather than a slot to sleep
// for. Jobs of priority queues take no work slot: urgent work never waits
// behind a full worker, as it did not before.

// WorkSlots bounds the jobs of a worker that work at once (see above).
type WorkSlots struct {
	free    chan struct{}
	waiting atomic.Int64
}

// NewWorkSlots returns n work slots.
func NewWorkSlots(n int) *WorkSlots {
	return &WorkSlots{free: make(chan struct{}, max(n, 1))}
}

// Waiting reports whether a job waits for a work slot. Nil: never.
func (w *WorkSlots) Waiting() bool { return w != nil && w.waiting.Load() > 0 }

// workSlot is the slot a job holds, given back once.
type workSlot struct {
	w    *WorkSlots
	once sync.Once
}

// take waits for a work slot until ctx ends or stopping closes, and returns
// the context the job runs in, which knows its slot (see giveBack).
func (w *WorkSlots) take(ctx context.Context, stopping <-chan struct{}) (context.Context, *workSlot, bool) {
	select {
	case w.free <- struct{}{}:
		s := &workSlot{w: w}
		return context.WithValue(ctx, workSlotKey{}, s), s, true
	default:
	}
	w.waiting.Add(1)
	defer w.waiting.Add(-1)
	select {
	case w.free <- struct{}{}:
		s := &workSlot{w: w}
		return context.WithValue(ctx, workSlotKey{}, s), s, true
	case <-ctx.Done():
	case <-stopping:
	}
	return ctx, nil, false
}

// giveBack gives the slot back, the first time it is called. Nil: nothing.
func (s *workSlot) giveBack() {
	if s != nil {
		s.once.Do(func() { <-s.w.free })
	}
}

type workSlotKey struct{}

// sleeping gives back the work slot of the job running in ctx, if it holds
// one: it sleeps until its moment, and sends then without one (a send due
// at its moment must not wait behind other jobs' work).
func sleeping(ctx context.Context) {
	s, _ := ctx.Value(workSlotKey{}).(*workSlot)
	s.giveBack()
}
