package throttle

import (
	"strconv"
	"time"
)

// maxCallTasks is the most tasks (request groups) one script call carries
// on a single node: enough to make a batch cheap, few enough that one call
// holds Redis up for a millisecond or so, not more.
const maxCallTasks = 100

// task is one group of one request: rs[req]'s takes in g.
type task struct {
	req int
	g   group
}

// call is one script invocation, for one or more tasks.
type call struct {
	// cmd is the whole command: "fcall", the function, the number of keys,
	// the keys, the arguments. To run it as a script instead, only cmd[0]
	// and cmd[1] change ("evalsha" and the SHA-1, or "eval" and the source).
	cmd   []any
	tasks []task
}

// newCall returns a call of nk keys and na arguments, and the parts of its
// command to fill in: the keys, to append to (up to nk), and the arguments.
func newCall(nk, na int) (c call, keys, args []any) {
	c.cmd = make([]any, 3+nk+na)
	c.cmd[2] = nk
	return c, c.cmd[3 : 3 : 3+nk], c.cmd[3+nk:]
}

// calls builds the script calls (admit.lua's or release.lua's calling
// convention) for tasks of rs, up to the engine's perCall tasks a call.
func (l *Limiter) calls(rs []Request, ts []task, admit bool) []call {
	per := l.eng.perCall()
	out := make([]call, 0, (len(ts)+per-1)/per)
	var buf []byte
	hs := make([]planHead, min(per, len(ts)))
	for lo := 0; lo < len(ts); lo += per {
		chunk := ts[lo:min(lo+per, len(ts))]
		nk := 0
		for j, t := range chunk {
			hs[j] = planHead{}
			if admit {
				hs[j] = l.eng.head(rs[t.req], t.g)
			}
			nk += taskKeyCount(rs[t.req], t.g, hs[j])
		}
		stride := taskArgs(admit)
		c, keys, args := newCall(nk, stride*len(chunk))
		c.tasks = chunk
		for j, t := range chunk {
			keys, buf = l.appendTask(keys, buf[:0], args[stride*j:stride*j+stride], rs[t.req], t.g, hs[j], admit)
		}
		out = append(out, c)
	}
	return out
}

// taskArgs is how many arguments a task takes in admit.lua's calling
// convention (admit: see setTaskArgs) or release.lua's (its ID and plan).
func taskArgs(admit bool) int {
	if admit {
		return 6
	}
	return 2
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

// appendTask appends the keys of the task of r's group g, headed by h, to
// keys, and sets its arguments (taskArgs(admit) of them) in args; its plan
// is built in buf.
func (l *Limiter) appendTask(keys []any, buf []byte, args []any, r Request, g group, h planHead, admit bool) ([]any, []byte) {
	keys, buf = l.appendPlan(keys, buf, r, g, h)
	if admit {
		setTaskArgs(args, r, string(buf), 0)
	} else {
		args[0], args[1] = r.ID, string(buf)
	}
	return keys, buf
}

// horizon reports whether r's booking has a horizon.
func horizon(r Request) bool { return r.book && r.BookAhead > 0 }

// deadline is r's deadline as admit.lua takes it: µs, 0 for none.
func deadline(r Request) int64 {
	if r.Deadline.IsZero() {
		return 0
	}
	return max(1, r.Deadline.UnixMicro())
}

// setTaskArgs sets r's arguments in admit.lua's calling convention, one
// value each: its ID, plan, deadline (µs, 0: none), floor (µs: a cluster's
// booking goes no earlier, 0: none), weight and tenant. Only a plan that
// books reads the last four.
func setTaskArgs(args []any, r Request, plan string, floor int64) {
	args[0], args[1], args[2], args[3] = r.ID, plan, deadline(r), floor
	args[4], args[5] = max(r.Weight, 1), r.Tenant
}

// planHead is what a plan says before its takes (see lua/rules.lua).
type planHead struct {
	maxWait int64  // µs a bucket may reserve ahead (0: none)
	ahead   int64  // µs after now quota entries are stamped at the earliest (0: not set)
	done    string // the done marker's key, checked first ("": none)
	book    bool   // a task that may not go within maxWait books its moment
}

// appendPlan appends the keys of g's takes of r to keys and their plan (see
// lua/rules.lua), headed by h, to buf; with h.done set, the done marker's
// key first.
func (l *Limiter) appendPlan(keys []any, buf []byte, r Request, g group, h planHead) ([]any, []byte) {
	buf = append(buf, l.remember...)
	buf = strconv.AppendInt(append(buf, ';'), h.maxWait, 10)
	if h.ahead > 0 {
		buf = strconv.AppendInt(append(buf, ':'), h.ahead, 10)
	}
	if h.done != "" {
		keys = append(keys, h.done)
		buf = append(buf, ";d"...)
	}
	if h.book {
		if r.Priority {
			buf = append(buf, ";K"...)
		} else {
			buf = append(buf, ";k"...)
		}
		if horizon(r) {
			buf = strconv.AppendInt(append(buf, ':'), r.BookAhead.Microseconds(), 10)
			if r.Backlog {
				buf = append(buf, ";u"...)
			}
		}
	}
	if r.check {
		buf = append(buf, ";n"...)
	}
	last, tag := "", ""
	for _, i := range g.takes {
		t := r.Takes[i]
		if t.Subject != last || tag == "" {
			last, tag = t.Subject, subjectTag(l.prefix, t.Subject)
		}
		keys = t.Rule.appendKeys(keys, tag)
		buf = append(buf, ';')
		if t.CountOnly {
			buf = append(buf, '*') // see lua/rules.lua
		}
		buf = t.Rule.appendPlan(buf, t.cost())
	}
	return keys, buf
}

// The reply admit.lua gives per task: replyLen integers, one value each,
// in this order (admit.lua's header says what each means):
//
//	allowed, repeated, binding, window, fresh, now, delay, remaining, outcome, extra
//
// allowed and repeated are 1 or 0; binding and window are 1-based (0:
// none); fresh has bit i-1 set for take i consumed by this call; now and
// delay are µs; outcome is one of the outcomes below, outcomeDone when the
// task's done marker exists (then every value but now is 0); extra is
// ahead (booked) or the claimed moment (allowed).
const (
	replyAllowed = iota
	replyRepeated
	replyBinding
	replyWindow
	replyFresh
	replyNow
	replyDelay
	replyRemaining
	replyOutcome
	replyExtra
	replyLen
)

// The outcomes admit.lua returns (see admit.lua).
const (
	outcomeDecided  = 0
	outcomeBooked   = 1
	outcomeExpired  = 2
	outcomeRebooked = 3
	outcomeQueued   = 4
	outcomeDone     = 5
)

// groupResult is what admit.lua returns for one group.
type groupResult struct {
	allowed, repeated bool
	done              bool  // the done marker exists: nothing checked
	now               int64 // µs
	delay             int64 // µs
	binding, window   int   // 1-based within the group, 0: none
	remaining         int64
	fresh             uint32 // bit i-1: this call consumed take i of the group
	outcome           int
	extra             int64 // ahead (booked) or the claimed moment (allowed)
}

// parseGroup reads the replyLen values admit.lua returns for one task.
func parseGroup(n []int64) groupResult {
	return groupResult{
		allowed:   n[replyAllowed] == 1,
		repeated:  n[replyRepeated] == 1,
		done:      n[replyOutcome] == outcomeDone,
		now:       n[replyNow],
		delay:     n[replyDelay],
		binding:   int(n[replyBinding]),
		window:    int(n[replyWindow]),
		remaining: n[replyRemaining],
		fresh:     uint32(n[replyFresh]),
		outcome:   int(n[replyOutcome]),
		extra:     n[replyExtra],
	}
}

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

// merge folds one group's result into the request's decision. The first
// group sets the decision; later ones can only lengthen the wait, lower the
// remaining capacity, or deny.
func merge(d *Decision, g groupResult, r Request, gr group, phase int) {
	if g.done {
		*d = Decision{Outcome: Done, Now: time.UnixMicro(g.now), TakeIndex: -1}
		return
	}
	if phase == 0 {
		*d = Decision{Outcome: Repeated, Now: time.UnixMicro(g.now), TakeIndex: -1, Remaining: int(g.remaining)}
	}
	delay := time.Duration(g.delay) * time.Microsecond
	if !g.allowed || delay > d.Delay {
		d.Delay = delay
		d.TakeIndex, d.Rule, d.Subject, d.Limit = -1, nil, "", ""
		if g.binding > 0 {
			i := gr.takes[g.binding-1]
			t := r.Takes[i]
			d.TakeIndex, d.Rule, d.Subject, d.Limit = i, t.Rule, t.Subject, t.Rule.bindingLimit(g.window)
		}
	}
	d.Remaining = min(d.Remaining, int(g.remaining))
	switch g.outcome {
	case outcomeBooked, outcomeRebooked, outcomeQueued:
		d.Outcome, d.Ahead = bookedOutcome[g.outcome], int(g.extra)
	case outcomeExpired:
		d.Outcome = Expired
	default:
		switch {
		case !g.allowed:
			d.Outcome = Denied
		case !g.repeated && d.Outcome == Repeated:
			d.Outcome = Admitted // a group consumed: the request is not a repeat
		}
		if g.allowed && g.extra > 0 {
			d.Claimed = time.UnixMicro(g.extra)
		}
		if g.allowed && !r.check && !g.tookAll(gr) {
			d.Held = true
		}
	}
}

// tookAll reports whether this call consumed every take of group gr.
func (g groupResult) tookAll(gr group) bool {
	all := ^uint32(0)
	if n := len(gr.takes); n < 32 {
		all = 1<<n - 1
	}
	return g.fresh == all
}

// bookedOutcome is the Outcome of admit.lua's booking outcomes.
var bookedOutcome = map[int]Outcome{outcomeBooked: Booked, outcomeRebooked: Rebooked, outcomeQueued: Placed}
