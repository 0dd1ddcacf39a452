package throttle

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// engine is how a Limiter turns requests into script calls, chosen in New:
// node for one Redis server (or a Sentinel-managed one), sharded for a
// Redis Cluster (cluster.go).
type engine interface {
	// decide decides r (validated): admits it (Admit, Check) or books it.
	decide(ctx context.Context, r Request) (Decision, error)
	// groups splits r's takes into the groups one script call covers; on a
	// cluster, apart keeps each subject's in a call of its own (together).
	groups(ctx context.Context, r Request, apart bool) []group
}

// node is the engine on one Redis server: every take of a request in one
// group, decided by one script call, which also checks the done marker.
type node struct{ *Limiter }

func (n node) groups(_ context.Context, r Request, _ bool) []group { return []group{single(r)} }

func (n node) decide(ctx context.Context, r Request) (Decision, error) {
	g := single(r)
	res, err := n.decideGroup(ctx, r, g, 0)
	if err != nil {
		return Decision{}, err
	}
	return decision(res, r, g), nil
}

// decideGroup runs one call of admit.lua's entry point for r (admit, or
// book for a request that books) on its takes in g, no earlier than floor;
// the commands beside, if any, go in the same round trip.
func (l *Limiter) decideGroup(ctx context.Context, r Request, g group, floor int64, beside ...redis.Cmder) (groupResult, error) {
	cv, e := admitting, l.admit
	if r.book != nil {
		cv, e = booking, l.book
	}
	var buf [128]byte
	c, _ := l.groupCall(r, g, l.head(r, g), cv, floor, buf[:0])
	res, err := l.eval1(ctx, e, c, beside...)
	if err != nil {
		return groupResult{}, fmt.Errorf("throttle: admit: %w", err)
	}
	if len(res) != replyLen {
		return groupResult{}, fmt.Errorf("throttle: unexpected script reply %v", res)
	}
	return parseGroup(res), nil
}

// group is the takes of one request that one script call can cover: all of
// them on a single node, those of one subject on a cluster.
type group struct {
	takes []int // indices into Request.Takes
	// unheld, when not 0, is the longest window (µs) of the request's
	// first take, a quota a group asked before found the task holding no
	// entry of: it holds no slot of this group's buckets either (see
	// lua/admit.lua's unheld), and they need not look.
	unheld int64
	// guard says the task's done marker is read beside this group's call,
	// on another node (a cluster's first call): see 'g' in lua/rules.lua.
	guard bool
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

// single is the group of all r's takes (validated: at most MaxTakes): a
// request's one group on a single node.
func single(r Request) group { return group{takes: allTakes[:len(r.Takes):len(r.Takes)]} }

// hasBucket reports whether g has a bucket take of r.
func (g group) hasBucket(r Request) bool {
	for _, i := range g.takes {
		if _, ok := r.Takes[i].Rule.(*Bucket); ok {
			return true
		}
	}
	return false
}
