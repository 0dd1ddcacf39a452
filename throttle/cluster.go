package throttle

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// sharded decides a request on a Redis Cluster, where each subject's keys
// live in a slot of their own: a call per group of takes by subject, each
// from the floor the groups before it allow. The protocol and why it never
// admits more than a rule allows: docs/design.md, "Redis Cluster".
type sharded struct{ *Limiter }

// clusterTries bounds the rounds.
const clusterTries = 3

// clusterSkew is how much later than the moment the groups before it
// allow a group's node may answer and still count as the same moment: the
// call comes a round trip later, on another node's clock. A send leaves
// after every call anyway, within its slot's window (book.lua's claim).
const clusterSkew = 50 * time.Millisecond

// groups splits r's takes into groups by subject, in the order they are
// asked: the bucket's first for a booking, last otherwise; unless apart,
// two subjects on one master share a call (together).
func (s sharded) groups(ctx context.Context, r Request, apart bool) []group {
	if !apart {
		if g, ok := s.together(ctx, r); ok {
			return []group{g}
		}
	}
	gs := bySubject(r, []group{single(r)})
	bucketFirst := r.book != nil
	ordered := make([]group, 0, len(gs))
	for _, first := range []bool{true, false} {
		for _, g := range gs {
			if g.hasBucket(r) == (first == bucketFirst) {
				ordered = append(ordered, g)
			}
		}
	}
	return ordered
}

// together is r's takes as one group when they are those of two subjects,
// one after the other, whose slots the same master serves by the client's
// map: one call decides them atomically, or answers NONLOCAL if the
// second's slot has moved since (docs/design.md, "Redis Cluster").
func (s sharded) together(ctx context.Context, r Request) (group, bool) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	n := len(r.Takes)
	if !ok || n < 2 {
		return group{}, false
	}
	cut := 1
	for cut < n && r.Takes[cut].Subject == r.Takes[0].Subject {
		cut++
	}
	if cut == n {
		return group{}, false
	}
	first, rest := 0, 0
	for i, t := range r.Takes {
		switch {
		case i >= cut && t.Subject != r.Takes[cut].Subject:
			return group{}, false // a third subject
		case i < cut:
			first += t.Rule.keyCount()
		default:
			rest += t.Rule.keyCount()
		}
	}
	if first == 0 || rest == 0 {
		return group{}, false // a call must declare a key, and a subject without any needs no node
	}
	a, errA := cc.MasterForKey(ctx, keyspace.Tag(s.prefix, r.Takes[0].Subject))
	b, errB := cc.MasterForKey(ctx, keyspace.Tag(s.prefix, r.Takes[cut].Subject))
	if errA != nil || errB != nil || a.Options().Addr != b.Options().Addr {
		return group{}, false
	}
	return single(r), true
}

// bySubject splits each of gs by subject.
func bySubject(r Request, gs []group) []group {
	var out []group
	for _, g := range gs {
		at := map[string]int{}
		for _, i := range g.takes {
			k, ok := at[r.Takes[i].Subject]
			if !ok {
				k = len(out)
				at[r.Takes[i].Subject] = k
				out = append(out, group{})
			}
			out[k].takes = append(out[k].takes, i)
		}
	}
	return out
}

// nonLocal reports whether err is a call's answer that a key it brought is
// not on its master any more (lua/rules.lua, task_keys).
func nonLocal(err error) bool { return redis.HasErrorPrefix(err, "NONLOCAL") }

func (s sharded) decide(ctx context.Context, r Request) (Decision, error) {
	d, err := s.decideIn(ctx, r, s.groups(ctx, r, false))
	if nonLocal(err) {
		d, err = s.decideIn(ctx, r, s.groups(ctx, r, true))
	}
	return d, err
}

// decideIn decides r in groups gs.
func (s sharded) decideIn(ctx context.Context, r Request, gs []group) (Decision, error) {
	if len(gs) == 1 && !r.CheckDone {
		res, err := s.decideGroup(ctx, r, gs[0], 0)
		if err != nil {
			return Decision{}, err
		}
		return decision(res, r, gs[0]), nil
	}
	c := &clusterCall{s: s, r: r, gs: gs, res: make([]groupResult, len(gs)), took: make([]group, len(gs)), setBy: -1}
	if r.CheckDone {
		c.done = redis.NewIntCmd(ctx, "exists", keyspace.Done(s.prefix, r.ID))
	}
	d, err := c.run(ctx)
	if err != nil || !d.Allowed() && !d.Booked() {
		c.compensate(ctx)
	}
	return d, err
}

// clusterCall is one request decided on a cluster: its groups in the order
// they are asked, what each answered last, what this call took in each,
// and the last answer that set a later moment than the groups before it
// (set, group setBy; -1: none), whose rule the decision names.
type clusterCall struct {
	s     sharded
	r     Request
	gs    []group
	res   []groupResult
	took  []group // per group, the takes this call consumed there
	setBy int
	set   groupResult
	// done is the read of the done marker, beside the first call: sent with
	// it, read once it has run (nil: not asked).
	done *redis.IntCmd
}

// run decides the request in rounds (see above).
func (c *clusterCall) run(ctx context.Context) (Decision, error) {
	var floor int64
	for try := 1; ; try++ {
		x, settled, err := c.round(ctx, floor, try == 1)
		if err != nil {
			return Decision{}, err
		}
		if settled >= 0 {
			return c.merge(settled), nil
		}
		if try == clusterTries {
			// The groups kept moving each other on: denied until the last
			// moment asked (what was taken is given back).
			d := c.merge(len(c.gs) - 1)
			d.Outcome, d.Held, d.Claimed, d.Ahead = Denied, false, time.Time{}, 0
			return d, nil
		}
		floor = x
	}
}

// round asks every group once, in order, each from the moment the ones
// before it allow (floor for the first). It returns the index of the last
// group asked when the request is settled, or -1 and the later moment a
// group set, from which the next round starts. The first round's first
// call reads the done marker beside it (group.guard) and may tell the
// groups after it that the task holds nothing (group.unheld).
func (c *clusterCall) round(ctx context.Context, floor int64, first bool) (int64, int, error) {
	x, raised := floor, false
	var unheld int64
	for i, g := range c.gs {
		g.unheld = unheld
		var beside []redis.Cmder
		if i == 0 && c.done != nil {
			beside, g.guard = []redis.Cmder{c.done}, true
		}
		res, err := c.s.decideGroup(ctx, c.r, g, x, beside...)
		if err != nil {
			return 0, 0, err
		}
		marked := false
		if i == 0 && c.done != nil {
			marked, c.done = c.marked(), nil
			if res.outcome == Done && !marked {
				// The group found the task let go before and wrote
				// nothing (see group.guard), and it is not marked: ask
				// again.
				g.guard = false
				if res, err = c.s.decideGroup(ctx, c.r, g, x); err != nil {
					return 0, 0, err
				}
			}
		}
		c.took[i].takes = append(c.took[i].takes, res.freshTakes(g).takes...)
		if marked {
			res = groupResult{outcome: Done, now: res.now} // what it took goes back
		}
		c.res[i] = res
		switch res.outcome {
		case Denied, Expired, Done, Placed:
			// Settled by this group: a place holds nothing and asks no
			// other node (the task comes back for the rest).
			return 0, i, nil
		}
		if q, ok := c.r.Takes[0].Rule.(*Quota); first && i == 0 && ok && !c.r.Takes[0].CountOnly && g.takes[0] == 0 && res.fresh&1 == 1 {
			unheld = q.Longest().Microseconds()
		}
		at := max(res.at(), x)
		if i > 0 && at > x+clusterSkew.Microseconds() {
			raised, c.setBy, c.set = true, i, res
		}
		x = max(x, at)
	}
	if raised {
		return x, -1, nil
	}
	return x, len(c.gs) - 1, nil
}

// marked reports whether the done marker read beside the first call
// exists; a read that failed says no (the admission goes on as without a
// marker, as asynq's redelivery of a task not sent would).
func (c *clusterCall) marked() bool {
	n, err := c.done.Result()
	return err == nil && n == 1
}

// merge is the decision of the groups up to last: settled by last's
// outcome where it ends the request, else allowed when every group lets
// the task go now (after a wait within its max wait) and booked otherwise,
// at the latest moment any group gave, named by the rule that set it.
func (c *clusterCall) merge(last int) Decision {
	res := c.res[last]
	switch res.outcome {
	case Denied, Expired, Done, Placed:
		d := decision(res, c.r, c.gs[last])
		if res.outcome == Done {
			d.Now = time.Time{} // no one time: see Done
		}
		return d
	}
	late := 0 // the group whose moment is the latest
	for i := 1; i <= last; i++ {
		if c.res[i].at() > c.res[late].at() {
			late = i
		}
	}
	d := decision(c.res[late], c.r, c.gs[late])
	if c.setBy >= 0 && c.set.binding > 0 && c.set.at()+clusterSkew.Microseconds() >= c.res[late].at() {
		// The moment is the one that group's own rules set.
		b := decision(c.set, c.r, c.gs[c.setBy])
		d.TakeIndex, d.Rule, d.Subject, d.Limit = b.TakeIndex, b.Rule, b.Subject, b.Limit
		if b.Booked() {
			d.Ahead = b.Ahead
		}
	}
	d.Outcome = Repeated
	for i := 0; i <= last; i++ {
		gd := decision(c.res[i], c.r, c.gs[i])
		if gd.Shadow >= 0 && (d.Shadow < 0 || gd.ShadowDelay > d.ShadowDelay) {
			d.Shadow, d.ShadowDelay = gd.Shadow, gd.ShadowDelay
		}
		d.Remaining = min(d.Remaining, gd.Remaining)
		d.Held = d.Held || gd.Held
		if d.Claimed.IsZero() {
			d.Claimed = gd.Claimed
		}
		switch {
		case gd.Outcome == Rebooked || gd.Outcome == Booked && d.Outcome != Rebooked:
			d.Outcome = gd.Outcome
		case gd.Outcome == Admitted && d.Outcome == Repeated:
			d.Outcome = Admitted
		}
	}
	if d.Booked() {
		d.Claimed, d.Held = time.Time{}, false
		if d.Ahead == 0 {
			d.Ahead = int(c.res[0].extra)
		}
	}
	if d.Delay <= 0 && d.Allowed() {
		d.TakeIndex, d.Rule, d.Subject, d.Limit = -1, nil, "", ""
	}
	return d
}

// compensate gives back what this call consumed in every group, for a
// request that did not go through; what the task held before (a
// redelivery) stays held. Best effort: entries it fails to give back stay
// until the task is decided again (which finds them its own) or expire.
func (c *clusterCall) compensate(ctx context.Context) {
	if c.r.check {
		return
	}
	var gs []group
	for i, g := range c.took {
		if len(g.takes) > 0 {
			gs = append(gs, g)
		}
		c.took[i] = group{}
	}
	if len(gs) > 0 {
		ctx := context.WithoutCancel(ctx)
		if _, err := c.s.eval(ctx, c.s.release, c.s.undoCalls(c.r, gs)); nonLocal(err) {
			_, _ = c.s.eval(ctx, c.s.release, c.s.undoCalls(c.r, bySubject(c.r, gs)))
		}
	}
}
