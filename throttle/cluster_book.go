package throttle

import (
	"context"
	"fmt"
	"time"
)

// On a Redis Cluster a recipient's quotas and a provider's bucket live on
// different nodes, and a booked moment needs both. A request that books is
// decided in three calls (lua/book.lua, book_bucket):
//
//  1. peek at the bucket: the moment it would give the task (a claimer's
//     ticket, or the first free slot in its calendar, held as its ticket
//     from then on), or a place in line past the horizon (then it stops);
//  2. book the quotas on their node no earlier than that moment: they
//     commit at the earliest moment that both allow, or claim there;
//  3. commit that moment at the bucket: claim the ticket (it goes) or keep
//     it (booked), or, if the quotas' moment is later than the ticket,
//     take a slot that allows it.
//
// Step 3 can find no slot for a later moment free (another task took it):
// the quotas are given back and it starts again, up to clusterBookTries
// times. In between, the quota entries of step 2 may deny a competing
// message to the same recipient a moment early; they never let more
// through than the windows allow, and the bucket's calendar is checked at
// the commit: no over-admission, as on the cluster's plain path.

// clusterBookTries bounds the attempts of one cluster booking.
const clusterBookTries = 3

// clusterBookMargin is how far after the bucket's peek a cluster booking's
// moment is at the earliest: the quotas' entries must not be stamped before
// the moment the message goes, and the bucket's commit, which sets it, is
// a round trip after the peek. The peek holds that slot (a ticket) until the
// commit.
const clusterBookMargin = 50 * time.Millisecond

// clusterBooks reports whether r books on a cluster: it asks to, its quotas,
// calendars and quiet hours (if any) share one subject, so that one call books them, and it has at
// most one bucket (Request.validate). Other requests take the plain path.
func clusterBooks(r Request) bool {
	if !r.book {
		return false
	}
	subject := ""
	for _, t := range r.Takes {
		if _, ok := t.Rule.(*Bucket); !ok { // a quota, calendar or quiet hours
			if subject != "" && t.Subject != subject {
				return false
			}
			subject = t.Subject
		}
	}
	return true
}

// bookCluster books r on a cluster. ok is false when r's bucket ledger
// already holds it (admitted before): the plain path answers that.
func (s sharded) bookCluster(ctx context.Context, r Request) (Decision, bool, error) {
	var q group
	bi := -1
	for i, t := range r.Takes {
		if _, isBucket := t.Rule.(*Bucket); isBucket {
			bi = i
		} else {
			q.takes = append(q.takes, i)
		}
	}
	if bi < 0 || len(q.takes) == 0 {
		return s.bookOneNode(ctx, r)
	}
	for try := 1; ; try++ {
		d, ok, settled, err := s.bookTry(ctx, r, q, bi, try == clusterBookTries)
		if err != nil || settled {
			return d, ok, err
		}
	}
}

// bookOneNode books r, whose takes are on one subject (one node), by one
// call, as on a single node.
func (s sharded) bookOneNode(ctx context.Context, r Request) (Decision, bool, error) {
	all := single(r)
	g, err := s.bookGroup(ctx, r, all, 0)
	if err != nil {
		return Decision{}, false, err
	}
	var d Decision
	merge(&d, g, r, all, 0)
	return d, true, nil
}

// bookTry is one attempt at booking r on a cluster: a peek at its bucket
// (take bi), its quotas (group q) booked no earlier, a commit at the
// bucket. settled is false when the slot went since the peek: the quotas
// were given back and it starts again, unless last, when it is denied at
// the bucket's next moment.
func (s sharded) bookTry(ctx context.Context, r Request, q group, bi int, last bool) (d Decision, ok, settled bool, err error) {
	v, err := s.bookBucket(ctx, r, bi, "peek", 0)
	if err != nil {
		return Decision{}, false, true, err
	}
	if v[3] == 1 {
		return Decision{}, false, true, nil
	}
	if v[4] != peekSlot {
		return s.inLine(r, bi, v), true, true, nil
	}
	// The quotas' moment is the send's: never before the commit at the
	// bucket, which comes a round trip later. A ticket's slot is the
	// task's own: its moment stands (the commit checks the slot has not
	// passed).
	floor, ticket := max(v[1], v[0]+clusterBookMargin.Microseconds()), v[2]
	if ticket > 0 {
		floor = v[1]
	}
	g, err := s.bookGroup(ctx, r, q, floor)
	if err != nil {
		s.dropTicket(ctx, r, bi, ticket)
		return Decision{}, false, true, err
	}
	b := clusterBooking{r: r, q: q, bi: bi, g: g, floor: floor, ticket: ticket}
	d = b.decision()
	if g.outcome == outcomeExpired {
		d.Outcome = Expired
		b.bind(&d)
		s.dropTicket(ctx, r, bi, ticket)
		return d, true, true, nil
	}
	if g.outcome == outcomeBooked && !g.allowed && ticket > 0 && b.at() == ticket {
		// Early, or booked at the slot the peek held: the moment stands,
		// nothing changed.
		d.Outcome, d.Ahead = Booked, int(v[5])
		b.bind(&d)
		return d, true, true, nil
	}
	c, err := s.bookBucket(ctx, r, bi, "commit", b.at())
	if err != nil {
		return Decision{}, false, true, err
	}
	if c[1] != 2 {
		return b.committed(d, c), true, true, nil
	}
	// The slot went since the peek: give the quotas back, again.
	rq := r
	rq.Takes = nil
	for _, i := range q.takes {
		rq.Takes = append(rq.Takes, r.Takes[i])
	}
	if _, err := s.Release(context.WithoutCancel(ctx), rq); err != nil {
		return Decision{}, false, true, err
	}
	if !last {
		return Decision{}, false, false, nil
	}
	now := c[0]
	d = Decision{Now: time.UnixMicro(now), TakeIndex: -1, Delay: time.Duration(c[2]-now) * time.Microsecond}
	t := r.Takes[bi]
	d.TakeIndex, d.Rule, d.Subject, d.Limit = bi, t.Rule, t.Subject, t.Rule.bindingLimit(0)
	return d, true, true, nil
}

// clusterBooking is what a cluster booking's quotas answered (g), at the
// floor the bucket's peek set, with the ticket the peek held (0: none).
type clusterBooking struct {
	r             Request
	q             group
	bi            int
	g             groupResult
	floor, ticket int64
}

// at is the moment the quotas booked (µs).
func (b clusterBooking) at() int64 { return b.g.now + b.g.delay }

// decision is the decision's time and delay.
func (b clusterBooking) decision() Decision {
	return Decision{Now: time.UnixMicro(b.g.now), TakeIndex: -1, Delay: time.Duration(b.g.delay) * time.Microsecond}
}

// bind names in d the rule that set the moment: a quota when it is later
// than the bucket's floor, else the bucket.
func (b clusterBooking) bind(d *Decision) {
	take, window := b.bi, 0
	if b.g.binding > 0 && b.at() > b.floor {
		take, window = b.q.takes[b.g.binding-1], b.g.window
	}
	t := b.r.Takes[take]
	d.TakeIndex, d.Rule, d.Subject, d.Limit = take, t.Rule, t.Subject, t.Rule.bindingLimit(window)
}

// committed is d once the bucket's commit answered c: the task goes
// (c[1] 0) or is booked (1).
func (b clusterBooking) committed(d Decision, c []int64) Decision {
	if c[1] == 0 {
		d.Outcome = Admitted
		if d.Delay > 0 {
			b.bind(&d)
		}
		if b.ticket > 0 {
			d.Claimed = time.UnixMicro(b.ticket)
		} else if b.g.allowed && b.g.extra > 0 {
			d.Claimed = time.UnixMicro(b.g.extra)
		}
		return d
	}
	d.Outcome, d.Ahead = Booked, int(c[2])
	if b.g.outcome == outcomeRebooked {
		d.Outcome = Rebooked
	}
	b.bind(&d)
	if d.TakeIndex != b.bi {
		d.Ahead = int(b.g.extra)
	}
	return d
}

// What a peek at the bucket says of the task's moment (book_bucket's line).
const (
	peekSlot    = 0 // a slot's: the quotas are asked next
	peekPlaced  = 1 // a new place in line
	peekStands  = 2 // its place in line stands
	peekExpired = 3 // its place would be past its deadline
)

// inLine is the decision for a task the bucket's peek v put in line (or
// kept there, or found its place past its deadline), its quotas not asked.
func (s sharded) inLine(r Request, bi int, v []int64) Decision {
	now, at := v[0], v[1]
	t := r.Takes[bi]
	d := Decision{Now: time.UnixMicro(now), TakeIndex: bi, Rule: t.Rule, Subject: t.Subject, Limit: t.Rule.bindingLimit(0),
		Delay: time.Duration(at-now) * time.Microsecond}
	if v[4] == peekExpired {
		d.Outcome = Expired
		return d
	}
	d.Outcome, d.Ahead = Placed, int(v[5])
	return d
}

// dropTicket gives back the ticket (slot) a peek held for r on its bucket
// take bi, when r goes no further: best effort, since a ticket nobody
// claims costs its slot and no more.
func (s sharded) dropTicket(ctx context.Context, r Request, bi int, ticket int64) {
	if ticket == 0 {
		return
	}
	rb := r
	rb.Takes = []Take{r.Takes[bi]}
	_, _ = s.Release(context.WithoutCancel(ctx), rb)
}

// bookBucket runs book_bucket (mode peek or commit) on r's bucket take bi.
func (s sharded) bookBucket(ctx context.Context, r Request, bi int, mode string, at int64) ([]int64, error) {
	t := r.Takes[bi]
	c, keys, args := newCall(t.Rule.keyCount(), 8)
	_, plan := s.appendPlan(keys, nil, r, group{takes: []int{bi}}, planHead{maxWait: r.MaxWait.Microseconds(), book: true})
	args[0], args[1], args[2], args[3] = mode, r.ID, string(plan), at
	args[4], args[5], args[6], args[7] = max(r.Weight, 1), r.Tenant, deadline(r), clusterBookMargin.Microseconds()
	res, err := s.eval(ctx, s.book, []call{c})
	if err != nil {
		return nil, fmt.Errorf("throttle: book %q at %s: %w", r.ID, t.Rule.Name(), err)
	}
	v := res[0]
	if len(v) < 3 || mode == "peek" && len(v) != 6 {
		return nil, fmt.Errorf("throttle: unexpected script reply %v", v)
	}
	return v, nil
}

// bookGroup books r's takes g (all on one node) by admit.lua, no earlier
// than floor.
func (s sharded) bookGroup(ctx context.Context, r Request, q group, floor int64) (groupResult, error) {
	nk := 0
	for _, i := range q.takes {
		nk += r.Takes[i].Rule.keyCount()
	}
	c, keys, args := newCall(nk, taskArgs(true))
	_, plan := s.appendPlan(keys, nil, r, q, planHead{maxWait: r.MaxWait.Microseconds(), book: true})
	setTaskArgs(args, r, string(plan), floor)
	res, err := s.eval(ctx, s.admit, []call{c})
	if err != nil {
		return groupResult{}, fmt.Errorf("throttle: admit: %w", err)
	}
	if len(res[0]) != replyLen {
		return groupResult{}, fmt.Errorf("throttle: unexpected script reply %v", res[0])
	}
	return parseGroup(res[0]), nil
}
