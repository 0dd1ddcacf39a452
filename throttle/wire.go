package throttle

import (
	"slices"
	"strconv"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// call is one script invocation, the whole command: "fcall", the function,
// the number of keys, the keys, the arguments. To run it as a script
// instead, only the first two change ("evalsha" and the SHA-1, or "eval" and
// the source).
type call []any

// newCall returns a call of nk keys and na arguments, and the parts of it to
// fill in: the keys, to append to (up to nk), and the arguments.
func newCall(nk, na int) (c call, keys, args []any) {
	c = make(call, 3+nk+na)
	c[2] = nk
	return c, c[3 : 3 : 3+nk], c[3+nk:]
}

// The calling conventions of the entry points (admit.lua's header, and
// release.lua's): what the task brings as arguments, after its keys.
type convention int

const (
	admitting convention = iota // admit: ID, plan, floor
	booking                     // book: ID, plan, floor, deadline, weight, tenant, back
	undoing                     // release, forget: ID, plan
)

// args is how many arguments a task brings under c.
func (c convention) args() int { return [...]int{admitting: 3, booking: 7, undoing: 2}[c] }

// undoCalls builds the calls of release.lua's entry points that undo r's
// takes in gs, one call a group.
func (l *Limiter) undoCalls(r Request, gs []group) []call {
	out := make([]call, len(gs))
	var buf []byte
	for i, g := range gs {
		out[i], buf = l.groupCall(r, g, planHead{}, undoing, 0, buf[:0])
	}
	return out
}

// groupCall builds the call of r's group g under convention cv, its plan
// headed by h and written in buf, from floor. On a cluster, a group of two
// subjects (cluster.go, together) declares its first subject's keys, and
// has the others after its arguments (lua/rules.lua, task_keys).
func (l *Limiter) groupCall(r Request, g group, h planHead, cv convention, floor int64, buf []byte) (call, []byte) {
	nk := taskKeyCount(r, g, h)
	c, keys, args := newCall(nk, cv.args())
	_, buf = l.appendPlan(keys, buf, r, g, h)
	setTaskArgs(args, r, string(buf), floor, cv)
	if n := l.declared(r, g, nk); n < nk {
		rest := c[3+n:] // the undeclared keys, then the arguments
		moved := slices.Clone(rest[:nk-n])
		copy(rest, rest[nk-n:])
		copy(rest[len(rest)-(nk-n):], moved)
		c[2] = n
	}
	return c, buf
}

// taskKeyCount is how many keys the task of r's group g, headed by h,
// brings to a call.
func taskKeyCount(r Request, g group, h planHead) int {
	nk := 0
	if h.done != "" {
		nk++
	}
	for _, i := range g.takes {
		nk += r.Takes[i].Rule.keyCount()
	}
	return nk
}

// setTaskArgs sets r's arguments under convention cv (see convention), its
// plan and floor given.
func setTaskArgs(args []any, r Request, plan string, floor int64, cv convention) {
	args[0], args[1] = r.ID, plan
	if cv == undoing {
		return
	}
	args[2] = floor
	if cv == admitting {
		return
	}
	b := r.book
	var deadline int64
	if !b.Deadline.IsZero() {
		deadline = max(1, b.Deadline.UnixMicro())
	}
	back := "0"
	if b.Back {
		back = "1"
	}
	args[3], args[4], args[5], args[6] = deadline, max(b.Weight, 1), b.Tenant, back
}

// declared is how many of the nk keys of r's group g its call declares: all
// of them, but on a cluster only those of the takes before the first of
// another subject than the group's first.
func (l *Limiter) declared(r Request, g group, nk int) int {
	if _, ok := l.eng.(sharded); !ok || len(g.takes) == 0 {
		return nk
	}
	first, keys := r.Takes[g.takes[0]].Subject, 0
	for _, i := range g.takes {
		if r.Takes[i].Subject != first {
			return keys
		}
		keys += r.Takes[i].Rule.keyCount()
	}
	return nk
}

// planHead is what a plan says before its takes (see lua/rules.lua).
type planHead struct {
	maxWait int64  // µs a bucket may reserve ahead (0: none)
	done    string // the done marker's key, checked first ("": none)
	unheld  int64  // group.unheld
	guard   bool   // group.guard
}

// head is what the plan of r's group g says before its takes; the done
// marker is in the plan on one node only (a cluster reads it beside its
// first call).
func (l *Limiter) head(r Request, g group) planHead {
	h := planHead{maxWait: r.MaxWait.Microseconds(), unheld: g.unheld, guard: g.guard}
	if _, one := l.eng.(node); one && r.CheckDone {
		h.done = keyspace.Done(l.prefix, r.ID)
	}
	return h
}

// appendPlan appends the keys of g's takes of r to keys and their plan (see
// lua/rules.lua), headed by h, to buf; with h.done set, the done marker's
// key first.
func (l *Limiter) appendPlan(keys []any, buf []byte, r Request, g group, h planHead) ([]any, []byte) {
	buf = append(buf, l.remember...)
	buf = strconv.AppendInt(append(buf, ';'), h.maxWait, 10)
	if h.done != "" {
		keys = append(keys, h.done)
		if _, quota := r.Takes[0].Rule.(*Quota); quota && r.DoneIfHeld && !r.Takes[0].CountOnly {
			buf = append(buf, ";D"...)
		} else {
			buf = append(buf, ";d"...)
		}
	}
	if b := r.book; b != nil {
		if b.Priority {
			buf = append(buf, ";K"...)
		} else {
			buf = append(buf, ";k"...)
		}
		if b.Horizon > 0 {
			buf = strconv.AppendInt(append(buf, ':'), b.Horizon.Microseconds(), 10)
			if b.Backlog {
				buf = append(buf, ";u"...)
			}
		}
	}
	if r.check {
		buf = append(buf, ";n"...)
	}
	if h.unheld > 0 {
		buf = strconv.AppendInt(append(buf, ";N:"...), h.unheld, 10)
	}
	if h.guard {
		buf = append(buf, ";g"...)
	}
	last, tag := "", ""
	for _, i := range g.takes {
		t := r.Takes[i]
		if t.Subject != last || tag == "" {
			last, tag = t.Subject, keyspace.Tag(l.prefix, t.Subject)
		}
		keys = t.Rule.appendKeys(keys, tag)
		buf = append(buf, ';')
		switch {
		case t.Shadow:
			buf = append(buf, '?') // see lua/rules.lua
		case t.CountOnly:
			buf = append(buf, '*')
		}
		buf = t.Rule.appendPlan(buf, t.cost())
	}
	return keys, buf
}

// replyLen is how many integers admit.lua's entry points reply with.
const replyLen = 10

// groupResult is what a script call answered for one group: its reply's
// integers, in their order (admit.lua's header says what each means).
type groupResult struct {
	outcome         Outcome // numbered alike
	binding, window int     // 1-based within the group, 0: none
	fresh           uint32  // bit i-1: this call consumed take i of the group
	now, delay      int64   // µs
	remaining       int64
	extra           int64 // ahead (booked, placed) or the claimed moment (admitted)
	// shadow is the take in shadow mode that would have held the task back
	// longest (1-based within the group, 0: none), for shadowDelay (µs).
	shadow      int
	shadowDelay int64
}

// parseGroup reads the replyLen integers of one task.
func parseGroup(n []int64) groupResult {
	return groupResult{outcome: Outcome(n[0]), binding: int(n[1]), window: int(n[2]), fresh: uint32(n[3]),
		now: n[4], delay: n[5], remaining: n[6], extra: n[7], shadow: int(n[8]), shadowDelay: n[9]}
}

// at is the moment the group answered for (µs): its wait from its now.
func (g groupResult) at() int64 { return g.now + g.delay }

// freshTakes returns the part of group gr that this call consumed.
func (g groupResult) freshTakes(gr group) group {
	var out group
	for i, t := range gr.takes {
		if i < 32 && g.fresh>>i&1 == 1 {
			out.takes = append(out.takes, t)
		}
	}
	return out
}

// tookAll reports whether this call consumed every take of group gr.
func (g groupResult) tookAll(gr group) bool {
	all := ^uint32(0)
	if n := len(gr.takes); n < 32 {
		all = 1<<n - 1
	}
	return g.fresh == all
}

// decision is the Decision of request r whose group gr answered g.
func decision(g groupResult, r Request, gr group) Decision {
	d := Decision{Outcome: g.outcome, Now: time.UnixMicro(g.now), Delay: time.Duration(g.delay) * time.Microsecond,
		TakeIndex: -1, Remaining: int(g.remaining), Shadow: -1}
	if g.shadow > 0 {
		d.Shadow, d.ShadowDelay = gr.takes[g.shadow-1], time.Duration(g.shadowDelay)*time.Microsecond
	}
	if g.outcome == Done {
		d.Delay, d.Remaining = 0, 0
		return d
	}
	if g.binding > 0 {
		i := gr.takes[g.binding-1]
		t := r.Takes[i]
		d.TakeIndex, d.Rule, d.Subject, d.Limit = i, t.Rule, t.Subject, t.Rule.bindingLimit(g.window)
	}
	switch {
	case d.Booked():
		d.Ahead = int(g.extra)
	case d.Allowed():
		if g.extra > 0 {
			d.Claimed = time.UnixMicro(g.extra)
		}
		d.Held = !r.check && !g.tookAll(gr)
	}
	return d
}
