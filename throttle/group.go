package throttle

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// group is the takes of one request that one script call can cover: all of
// them on a single node, those of one subject on a cluster.
type group struct {
	takes []int // indices into Request.Takes
}

// plan splits r's takes into groups. On a cluster the groups follow the
// subjects, and the groups holding buckets come last: buckets are shared by
// every subject, so they are the ones worth not holding while a recipient's
// quota is still undecided.
func (l *Limiter) plan(r Request) []group {
	if !l.cluster {
		g := group{takes: make([]int, len(r.Takes))}
		for i := range r.Takes {
			g.takes[i] = i
		}
		return []group{g}
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

// call is one script invocation.
type call struct {
	keys []string
	args []any
}

// call builds the script call for one group of r (see lua/rules.lua for the
// calling convention).
func (l *Limiter) call(r Request, g group) call {
	c := call{
		keys: make([]string, 0, len(g.takes)+1),
		args: make([]any, 0, 4+6*len(g.takes)),
	}
	c.args = append(c.args, r.ID, strconv.FormatInt(r.MaxWait.Microseconds(), 10), l.remember, strconv.Itoa(len(g.takes)))
	for _, i := range g.takes {
		t := r.Takes[i]
		c.keys = t.Rule.appendKeys(c.keys, subjectTag(l.prefix, t.Key))
		c.args = t.Rule.appendArgs(c.args, t.cost())
	}
	return c
}

// eval runs one script for each call, in one round trip (a pipeline) when
// there are several. Calls that find the script not cached on their node are
// sent again whole; only those, since the others have already run.
func (l *Limiter) eval(ctx context.Context, s *redis.Script, calls []call) ([]any, error) {
	if len(calls) == 1 {
		v, err := s.Run(ctx, l.rdb, calls[0].keys, calls[0].args...).Result()
		return []any{v}, err
	}
	cmds := l.pipeline(ctx, calls, func(p redis.Pipeliner, c call) *redis.Cmd {
		return s.EvalSha(ctx, p, c.keys, c.args...)
	})
	var missing []call
	var at []int
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			missing, at = append(missing, calls[i]), append(at, i)
		}
	}
	if len(missing) > 0 {
		again := l.pipeline(ctx, missing, func(p redis.Pipeliner, c call) *redis.Cmd {
			return s.Eval(ctx, p, c.keys, c.args...)
		})
		for k, i := range at {
			cmds[i] = again[k]
		}
	}
	res := make([]any, len(cmds))
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return nil, err
		}
		res[i] = c.Val()
	}
	return res, nil
}

// pipeline sends one command per call in one round trip; each command
// carries its own error.
func (l *Limiter) pipeline(ctx context.Context, calls []call, run func(redis.Pipeliner, call) *redis.Cmd) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = run(p, c)
		}
		return nil
	})
	return cmds
}

// groupResult is what admit.lua returns for one group.
type groupResult struct {
	allowed, repeated bool
	now               int64 // µs
	delay             int64 // µs
	binding, window   int   // 1-based within the group, 0: none
	remaining         int64
	fresh             string // per take of the group: '1' if this call consumed it
}

func parseGroup(v any) (groupResult, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 8 {
		return groupResult{}, fmt.Errorf("throttle: unexpected script reply %v", v)
	}
	fresh, ok := a[7].(string)
	if !ok {
		return groupResult{}, fmt.Errorf("throttle: unexpected script reply %v", v)
	}
	n := make([]int64, 7)
	for i, x := range a[:7] {
		if n[i], ok = x.(int64); !ok {
			return groupResult{}, fmt.Errorf("throttle: unexpected script reply %v", v)
		}
	}
	return groupResult{
		allowed: n[0] == 1, now: n[1], delay: n[2], binding: int(n[3]),
		remaining: n[4], repeated: n[5] == 1, window: int(n[6]), fresh: fresh,
	}, nil
}

// freshTakes returns the part of group g that this call consumed.
func (g groupResult) freshTakes(gr group) group {
	var out group
	for i, t := range gr.takes {
		if i < len(g.fresh) && g.fresh[i] == '1' {
			out.takes = append(out.takes, t)
		}
	}
	return out
}

// merge folds one group's result into the request's decision. The first
// group sets the decision; later ones can only lengthen the wait, lower the
// remaining capacity, or deny.
func merge(d *Decision, g groupResult, r Request, gr group, phase int) {
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
			d.Take, d.Rule, d.Key, d.Limit = i, t.Rule, t.Key, t.Rule.String()
			if q, ok := t.Rule.(*Quota); ok && g.window > 0 {
				d.Limit = q.windows[g.window-1].String()
			}
		}
	}
	d.Allowed = d.Allowed && g.allowed
	d.Remaining = min(d.Remaining, int(g.remaining))
	d.Repeated = d.Repeated && g.repeated
}
