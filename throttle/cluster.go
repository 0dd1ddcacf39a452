package throttle

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// checkDone marks Done the decisions of the requests whose
// done marker exists, in one round trip.
func (s sharded) checkDone(ctx context.Context, rs []Request, ds []Decision) error {
	var idx []int
	for i, r := range rs {
		if r.CheckDone {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	cmds := make([]*redis.IntCmd, len(idx))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range idx {
			cmds[k] = p.Exists(ctx, doneKey(s.prefix, rs[i].ID))
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

// restampQuotas moves the quota entries that a request's
// quota groups stamped provisionally at now + MaxWait (see calls) to the
// moment its provider token was reserved for, measured on the quota's own
// node: now' + Delay, never later than the provisional stamp. Each node's
// now' is at least the real moment of the call, so the new stamp is never
// earlier than the send, and the quota never admits more than it allows.
// It is best effort: entries left at the provisional stamp only count
// longer (conservative).
func (s sharded) restampQuotas(ctx context.Context, rs []Request, ds []Decision, consumed [][]group) {
	var calls []call
	for i, r := range rs {
		if !ds[i].Allowed() || !stampsAhead(r) {
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
			_, plan := s.appendPlan(keys, nil, r, q, planHead{})
			args[0], args[1], args[2] = ds[i].Delay.Microseconds(), r.ID, string(plan)
			calls = append(calls, c)
		}
	}
	if len(calls) > 0 {
		_, _ = s.eval(context.WithoutCancel(ctx), s.restamp, calls)
	}
}

// groups splits r's takes into groups by subject, the groups holding
// buckets last: buckets are shared by every subject, so they are the ones
// worth not holding while a recipient's quota is still undecided.
func (s sharded) groups(r Request) []group {
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

// stampsAhead reports whether r's quota groups are stamped provisionally
// ahead on a cluster: r may reserve a bucket token ahead.
func stampsAhead(r Request) bool {
	if r.MaxWait <= 0 {
		return false
	}
	for _, t := range r.Takes {
		if _, ok := t.Rule.(*Bucket); ok {
			return true
		}
	}
	return false
}
