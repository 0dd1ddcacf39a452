package throttle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// group is the takes of one request that one script call can cover: all of
// them on a single node, those of one subject on a cluster.
type group struct {
	takes []int // indices into Request.Takes
}

// allTakes is the group of every take of a request (up to MaxTakes), shared:
// group.takes is never written to.
var allTakes = func() []int {
	s := make([]int, MaxTakes)
	for i := range s {
		s[i] = i
	}
	return s
}()

// plan splits r's takes into groups. On a cluster the groups follow the
// subjects, and the groups holding buckets come last: buckets are shared by
// every subject, so they are the ones worth not holding while a recipient's
// quota is still undecided.
func (l *Limiter) plan(r Request) []group {
	if !l.cluster {
		return []group{l.single(r)}
	}
	bySubject := map[string]int{}
	var gs []group
	var hasBucket []bool
	for i, t := range r.Takes {
		k, ok := bySubject[t.Key]
		if !ok {
			k = len(gs)
			bySubject[t.Key] = k
			gs = append(gs, group{})
			hasBucket = append(hasBucket, false)
		}
		gs[k].takes = append(gs[k].takes, i)
		if _, ok := t.Rule.(*Bucket); ok {
			hasBucket[k] = true
		}
	}
	ordered := make([]group, 0, len(gs))
	for _, last := range []bool{false, true} {
		for k, g := range gs {
			if hasBucket[k] == last {
				ordered = append(ordered, g)
			}
		}
	}
	return ordered
}

// single is the one group of r on a single node: all its takes.
func (l *Limiter) single(r Request) group {
	if len(r.Takes) <= len(allTakes) {
		return group{takes: allTakes[:len(r.Takes):len(r.Takes)]}
	}
	g := group{takes: make([]int, len(r.Takes))}
	for i := range r.Takes {
		g.takes[i] = i
	}
	return g
}

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
// convention) for tasks of rs. On a single node a call carries up to
// maxCallTasks tasks; on a cluster each task is a call of its own, since
// tasks of different subjects live in different slots.
func (l *Limiter) calls(rs []Request, ts []task, admit bool) []call {
	per := maxCallTasks
	if l.cluster {
		per = 1
	}
	out := make([]call, 0, (len(ts)+per-1)/per)
	var buf []byte
	for lo := 0; lo < len(ts); lo += per {
		chunk := ts[lo:min(lo+per, len(ts))]
		nk := 0
		for _, t := range chunk {
			if admit && l.checksDone(rs[t.req]) {
				nk++
			}
			if admit && horizon(rs[t.req]) && !l.cluster {
				nk++
			}
			for _, i := range t.g.takes {
				nk += rs[t.req].Takes[i].Rule.keyCount()
			}
		}
		stride := 2
		if admit {
			stride = 3
		}
		c, keys, args := newCall(nk, stride*len(chunk))
		c.tasks = chunk
		for j, t := range chunk {
			r := rs[t.req]
			var maxWait int64
			if admit {
				maxWait = r.MaxWait.Microseconds()
			}
			h := planHead{maxWait: maxWait, book: admit && l.books(r)}
			if admit && l.checksDone(r) {
				h.done = r.Done
			}
			if admit && l.stampsAhead(r) && !groupHasBucket(r, t.g) {
				// A quota group admitted before the request's bucket group
				// reserves a token up to MaxWait ahead: its entries are
				// stamped at now + MaxWait, later than any moment the
				// bucket can reserve, and restamped once that moment is
				// known (restampQuotas).
				h.ahead = maxWait
			}
			keys, buf = l.appendPlan(keys, buf[:0], r, t.g, h)
			args[stride*j], args[stride*j+1] = r.ID, string(buf)
			if admit {
				args[stride*j+2] = taskArg(r, l.books(r), 0, "")
			}
		}
		out = append(out, c)
	}
	return out
}

// books reports whether r's admission books: on a single node, when asked.
func (l *Limiter) books(r Request) bool { return r.Book && !l.cluster }

// horizon reports whether r's booking has a horizon (and so a task key).
func horizon(r Request) bool { return r.Book && r.BookAhead > 0 }

// deadline is r's deadline as admit.lua takes it: µs, 0 for none.
func deadline(r Request) int64 {
	if r.Deadline.IsZero() {
		return 0
	}
	return max(1, r.Deadline.UnixMicro())
}

// taskArg is admit.lua's third argument for r: its deadline, and for a
// request that books, "deadline,floor,weight,place,tenant" (see admit.lua's
// when; place "" on a single node, where the task's hash is one of its keys).
func taskArg(r Request, book bool, floor int64, place string) any {
	if !book {
		return deadline(r)
	}
	w := max(r.Weight, 1)
	return strconv.FormatInt(deadline(r), 10) + "," + strconv.FormatInt(floor, 10) + "," + strconv.Itoa(w) + "," + place + "," + r.Tenant
}

// checksDone reports whether r's admission script checks its done marker:
// on a single node. A cluster checks it with a call of its own (see
// AdmitBatch).
func (l *Limiter) checksDone(r Request) bool { return r.Done != "" && !l.cluster }

// stampsAhead reports whether r's quota groups are stamped provisionally
// ahead: on a cluster, for a request that may reserve a bucket token ahead.
func (l *Limiter) stampsAhead(r Request) bool {
	if !l.cluster || r.MaxWait <= 0 {
		return false
	}
	for _, t := range r.Takes {
		if _, ok := t.Rule.(*Bucket); ok {
			return true
		}
	}
	return false
}

func groupHasBucket(r Request, g group) bool {
	for _, i := range g.takes {
		if _, ok := r.Takes[i].Rule.(*Bucket); ok {
			return true
		}
	}
	return false
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
			// On a cluster the task's hash lives elsewhere: the caller
			// reads and notes its place (see placeOf).
			if !l.cluster {
				keys = append(keys, r.TaskKey)
			}
			buf = strconv.AppendInt(append(buf, ':'), r.BookAhead.Microseconds(), 10)
		}
	}
	if r.check {
		buf = append(buf, ";n"...)
	}
	last, tag := "", ""
	for _, i := range g.takes {
		t := r.Takes[i]
		if t.Key != last || tag == "" {
			last, tag = t.Key, subjectTag(l.prefix, t.Key)
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

// eval runs entry point e for each call, in one round trip (a pipeline) when
// there are several, and returns each call's reply (every entry point
// replies with an array of integers); a call that failed has a nil reply,
// and the first error is returned.
//
// It calls the library's function (FCALL). A node that does not have the
// library (a restarted server, FUNCTION FLUSH, a new or failed-over cluster
// node) gets it loaded (every master of a cluster does) and those calls are
// sent again, and only those, since the others have run. A server without
// functions (Redis < 7, miniredis, an ACL that forbids them) gets the same
// code as a script (EVALSHA, then EVAL where the script is not cached) from
// then on.
func (l *Limiter) eval(ctx context.Context, e entry, calls []call) ([][]int64, error) {
	vals := make([][]int64, len(calls))
	errs := make([]error, len(calls))
	todo := make([]int, len(calls))
	for i := range todo {
		todo[i] = i
	}
	if !l.noFunctions.Load() {
		l.send(ctx, calls, todo, vals, errs, "fcall", e.fn)
		if again := failing(todo, errs, functionMissing); len(again) > 0 {
			loadErr := l.loadFunctions(ctx)
			if loadErr != nil && noFunctions(loadErr) {
				// Functions are not allowed here after all: scripts, below.
				for _, i := range again {
					errs[i] = loadErr
				}
			} else {
				// Sent again even if a node could not take the library (a
				// cluster master that is down): theirs may have.
				l.send(ctx, calls, again, vals, errs, "fcall", e.fn)
				if loadErr != nil {
					for _, i := range failing(again, errs, functionMissing) {
						errs[i] = loadErr
					}
				}
			}
		}
		todo = failing(todo, errs, noFunctions)
		if len(todo) > 0 {
			l.noFunctions.Store(true)
		}
	}
	if len(todo) > 0 {
		l.send(ctx, calls, todo, vals, errs, "evalsha", e.sha)
		if again := failing(todo, errs, func(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }); len(again) > 0 {
			l.send(ctx, calls, again, vals, errs, "eval", e.src)
		}
	}
	for _, err := range errs {
		if err != nil {
			return vals, err
		}
	}
	return vals, nil
}

// eval1 is eval for one call, with the common case (the library is loaded)
// taking nothing but the command and its reply.
func (l *Limiter) eval1(ctx context.Context, e entry, c call) ([]int64, error) {
	if !l.noFunctions.Load() {
		c.cmd[0], c.cmd[1] = "fcall", e.fn
		v, err := l.run1(ctx, c.cmd)
		if err == nil || !functionMissing(err) && !noFunctions(err) {
			return v, err
		}
	}
	// The library must be loaded, or scripts used: eval knows how. The
	// FCALL above failed, so nothing ran.
	res, err := l.eval(ctx, e, []call{c})
	return res[0], err
}

// send runs calls[idx] as command name on target (function, SHA-1 or
// source), in one round trip, and records each one's reply and error.
func (l *Limiter) send(ctx context.Context, calls []call, idx []int, vals [][]int64, errs []error, name string, target any) {
	for _, i := range idx {
		calls[i].cmd[0], calls[i].cmd[1] = name, target
	}
	if len(idx) == 1 {
		i := idx[0]
		vals[i], errs[i] = l.run1(ctx, calls[i].cmd)
		return
	}
	cmds := make([]*redis.IntSliceCmd, len(idx))
	_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range idx {
			cmds[k] = redis.NewIntSliceCmd(ctx, calls[i].cmd...)
			_ = p.Process(ctx, cmds[k])
		}
		return nil
	})
	for k, i := range idx {
		vals[i], errs[i] = cmds[k].Result()
	}
}

// run1 runs one command that replies with an array of integers.
func (l *Limiter) run1(ctx context.Context, cmd []any) ([]int64, error) {
	c := redis.NewIntSliceCmd(ctx, cmd...)
	_ = l.rdb.Process(ctx, c)
	return c.Result()
}

// failing returns the indices in idx whose error matches.
func failing(idx []int, errs []error, match func(error) bool) []int {
	var out []int
	for _, i := range idx {
		if errs[i] != nil && match(errs[i]) {
			out = append(out, i)
		}
	}
	return out
}

// functionMissing reports a node without the library's functions.
func functionMissing(err error) bool { return redis.HasErrorPrefix(err, "Function not found") }

// noFunctions reports a server that cannot run functions: FCALL or FUNCTION
// unknown, or not permitted to this user.
func noFunctions(err error) bool {
	if redis.HasErrorPrefix(err, "unknown command") {
		return true
	}
	if redis.HasErrorPrefix(err, "NOPERM") {
		msg := strings.ToLower(err.Error())
		return strings.Contains(msg, "'fcall'") || strings.Contains(msg, "'function")
	}
	return false
}

// loadFunctions loads the library on the server, or on every master of a
// cluster (or every shard of a ring). A library of that name is this very
// code (the name carries its hash), so "already exists" is success.
func (l *Limiter) loadFunctions(ctx context.Context) error {
	l.loading.Lock()
	defer l.loading.Unlock()
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, l.lib.Source).Err()
		if err != nil && redis.HasErrorPrefix(err, "Library '"+l.lib.Name+"' already exists") {
			return nil
		}
		return err
	}
	var err error
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, load)
	case *redis.Ring:
		err = c.ForEachShard(ctx, load)
	case *redis.Client:
		err = load(ctx, c)
	default:
		err = l.rdb.FunctionLoad(ctx, l.lib.Source).Err()
		if err != nil && redis.HasErrorPrefix(err, "Library '"+l.lib.Name+"' already exists") {
			err = nil
		}
	}
	if err != nil && !noFunctions(err) {
		err = fmt.Errorf("load the Lua library: %w", err)
	}
	return err
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
		*d = Decision{Done: true, Now: time.UnixMicro(g.now), Take: -1}
		return
	}
	if phase == 0 {
		*d = Decision{Allowed: true, Now: time.UnixMicro(g.now), Take: -1, Remaining: int(g.remaining), Repeated: true}
	}
	delay := time.Duration(g.delay) * time.Microsecond
	if !g.allowed || delay > d.Delay {
		d.Delay = delay
		d.Take, d.Rule, d.Key, d.Limit = -1, nil, "", ""
		if g.binding > 0 {
			i := gr.takes[g.binding-1]
			t := r.Takes[i]
			d.Take, d.Rule, d.Key, d.Limit = i, t.Rule, t.Key, t.Rule.bindingLimit(g.window)
		}
	}
	d.Allowed = d.Allowed && g.allowed
	d.Remaining = min(d.Remaining, int(g.remaining))
	d.Repeated = d.Repeated && g.repeated
	switch g.outcome {
	case outcomeBooked, outcomeRebooked, outcomeQueued:
		d.Booked, d.Rebooked, d.Queued, d.Ahead = true, g.outcome == outcomeRebooked, g.outcome == outcomeQueued, int(g.extra)
	case outcomeExpired:
		d.Expired = true
	default:
		if g.allowed && g.extra > 0 {
			d.Claimed = time.UnixMicro(g.extra)
		}
	}
}
