package throttle

import (
	"context"
	"fmt"
)

// engine is how a Limiter turns requests into script calls, chosen once in
// New from the client it is given: node for one Redis server (or a
// Sentinel-managed one), sharded for a Redis Cluster. Everything that
// differs between the two is here; the rest of the package is shared.
type engine interface {
	// admitOne decides r (validated), as Admit documents.
	admitOne(ctx context.Context, r Request) (Decision, error)
	// admitBatch decides rs (validated), as admitMany documents.
	admitBatch(ctx context.Context, rs []Request) ([]Decision, error)
	// groups splits r's takes into the groups one script call covers.
	groups(r Request) []group
	// perCall is the most tasks (request groups) one script call carries.
	perCall() int
	// head is what the plan of r's group g says before its takes in an
	// admission.
	head(r Request, g group) planHead
}

// node is the engine on one Redis server: every take of a request in one
// group, checked and consumed by one script call, which also checks the
// done marker and books; calls carry up to maxCallTasks tasks.
type node struct{ *Limiter }

func (n node) groups(r Request) []group { return []group{single(r)} }

func (n node) perCall() int { return maxCallTasks }

func (n node) head(r Request, _ group) planHead {
	h := planHead{maxWait: r.MaxWait.Microseconds(), book: r.book}
	if r.CheckDone {
		h.done = doneKey(n.prefix, r.ID)
	}
	return h
}

// admitOne is what admit does for one request, which is one group, one call
// and nothing to compensate, without its bookkeeping.
func (n node) admitOne(ctx context.Context, r Request) (Decision, error) {
	g := single(r)
	h := n.head(r, g)
	c, keys, args := newCall(taskKeyCount(r, g, h), taskArgs(true))
	var buf [128]byte
	n.appendTask(keys, buf[:0], args, r, g, h, true)
	res, err := n.eval1(ctx, n.Limiter.admit, c)
	if err != nil {
		return Decision{}, fmt.Errorf("throttle: admit: %w", err)
	}
	if len(res) != replyLen {
		return Decision{}, fmt.Errorf("throttle: unexpected script reply %v", res)
	}
	var d Decision
	merge(&d, parseGroup(res), r, g, 0)
	return d, nil
}

func (n node) admitBatch(ctx context.Context, rs []Request) ([]Decision, error) {
	plans := make([][]group, len(rs))
	for i, r := range rs {
		plans[i] = n.groups(r)
	}
	ds := make([]Decision, len(rs))
	if _, err := n.admitGroups(ctx, rs, ds, plans); err != nil {
		return nil, err
	}
	return ds, nil
}

// sharded is the engine on a Redis Cluster, where each subject's keys live
// in a slot of their own: a request's takes are grouped by subject and the
// groups admitted one after another (see Limiter), one call per group;
// done markers are checked, and bookings made, by calls of their own
// before the groups (see first), and quota entries stamped ahead are
// restamped after (restampQuotas).
type sharded struct{ *Limiter }

func (s sharded) perCall() int { return 1 }

func (s sharded) head(r Request, g group) planHead {
	h := planHead{maxWait: r.MaxWait.Microseconds()}
	if stampsAhead(r) && !groupHasBucket(r, g) {
		// A quota group admitted before the request's bucket group
		// reserves a token up to MaxWait ahead: its entries are
		// stamped at now + MaxWait, later than any moment the
		// bucket can reserve, and restamped once that moment is
		// known (restampQuotas).
		h.ahead = h.maxWait
	}
	return h
}

func (s sharded) admitOne(ctx context.Context, r Request) (Decision, error) {
	ds, err := s.admitBatch(ctx, []Request{r})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

func (s sharded) admitBatch(ctx context.Context, rs []Request) ([]Decision, error) {
	plans := make([][]group, len(rs))
	for i, r := range rs {
		plans[i] = s.groups(r)
	}
	ds := make([]Decision, len(rs))
	if err := s.first(ctx, rs, ds, plans); err != nil {
		return nil, err
	}
	consumed, err := s.admitGroups(ctx, rs, ds, plans)
	if err != nil {
		return nil, err
	}
	s.restampQuotas(ctx, rs, ds, consumed)
	return ds, nil
}

// first decides what the admission's groups do not: done markers first,
// each in its own slot (a done request has no groups to admit), then
// bookings, one request at a time (see bookCluster). A request decided here
// has its plan emptied.
func (s sharded) first(ctx context.Context, rs []Request, ds []Decision, plans [][]group) error {
	if err := s.checkDone(ctx, rs, ds); err != nil {
		return err
	}
	for i, r := range rs {
		if ds[i].Outcome == Done {
			plans[i] = nil
			continue
		}
		if !clusterBooks(r) {
			continue
		}
		d, ok, err := s.bookCluster(ctx, r)
		if err != nil {
			return err
		}
		if ok {
			ds[i], plans[i] = d, nil
		}
	}
	return nil
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
	t := make([]int, MaxTakes)
	for i := range t {
		t[i] = i
	}
	return t
}()

// single is the group of all r's takes: a request's one group on a single node.
func single(r Request) group {
	if len(r.Takes) <= len(allTakes) {
		return group{takes: allTakes[:len(r.Takes):len(r.Takes)]}
	}
	g := group{takes: make([]int, len(r.Takes))}
	for i := range r.Takes {
		g.takes[i] = i
	}
	return g
}

// groupHasBucket reports whether g has a bucket take of r.
func groupHasBucket(r Request, g group) bool {
	for _, i := range g.takes {
		if _, ok := r.Takes[i].Rule.(*Bucket); ok {
			return true
		}
	}
	return false
}
