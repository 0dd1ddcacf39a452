package throttle

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// checkDone (cluster only) marks Done the decisions of the requests whose
// done marker exists, in one round trip.
func (l *Limiter) checkDone(ctx context.Context, rs []Request, ds []Decision) error {
	var idx []int
	for i, r := range rs {
		if r.Done != "" {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	cmds := make([]*redis.IntCmd, len(idx))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range idx {
			cmds[k] = p.Exists(ctx, rs[i].Done)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("throttle: check done markers: %w", err)
	}
	for k, i := range idx {
		if cmds[k].Val() == 1 {
			ds[i] = Decision{Outcome: Done, TakeIndex: -1}
		}
	}
	return nil
}

// restampQuotas (cluster only) moves the quota entries that a request's
// quota groups stamped provisionally at now + MaxWait (see calls) to the
// moment its provider token was reserved for, measured on the quota's own
// node: now' + Delay, never later than the provisional stamp. Each node's
// now' is at least the real moment of the call, so the new stamp is never
// earlier than the send, and the quota never admits more than it allows.
// It is best effort: entries left at the provisional stamp only count
// longer (conservative).
func (l *Limiter) restampQuotas(ctx context.Context, rs []Request, ds []Decision, consumed [][]group) {
	if !l.cluster {
		return
	}
	var calls []call
	for i, r := range rs {
		if !ds[i].Allowed() || !l.stampsAhead(r) {
			continue
		}
		for _, g := range consumed[i] {
			var q group
			for _, k := range g.takes {
				switch r.Takes[k].Rule.(type) {
				case *Quota, *CalendarWindow:
					q.takes = append(q.takes, k)
				}
			}
			if len(q.takes) == 0 {
				continue
			}
			nk := len(q.takes)
			c, keys, args := newCall(nk, 3)
			_, plan := l.appendPlan(keys, nil, r, q, planHead{})
			args[0], args[1], args[2] = ds[i].Delay.Microseconds(), r.ID, string(plan)
			calls = append(calls, c)
		}
	}
	if len(calls) > 0 {
		_, _ = l.eval(context.WithoutCancel(ctx), l.restamp, calls)
	}
}

// compensate releases what this call consumed for the requests that match,
// so that a request denied (or failed) part way leaves nothing behind, and
// what a task held before (a redelivery) stays held. It is best effort: if
// it fails, the entries stay until the task is admitted again (which finds
// them its own) or they expire.
func (l *Limiter) compensate(ctx context.Context, rs []Request, consumed [][]group, match func(int) bool) {
	var ts []task
	for i := range rs {
		if !match(i) {
			continue
		}
		for _, g := range consumed[i] {
			if len(g.takes) > 0 {
				ts = append(ts, task{i, g})
			}
		}
	}
	if len(ts) > 0 {
		_, _ = l.eval(context.WithoutCancel(ctx), l.release, l.calls(rs, ts, false))
	}
}

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
		k, ok := bySubject[t.Subject]
		if !ok {
			k = len(gs)
			bySubject[t.Subject] = k
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
