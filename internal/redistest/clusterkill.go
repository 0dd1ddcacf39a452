package redistest

import (
	"context"
)

// A master that crashes, as opposed to one handed over with Failover: the
// test kills it (Masters[i].Kill(), SIGKILL), the other masters flag it as
// failed after cluster-node-timeout (2000 ms here) and its replica wins an
// election and takes its slots, 3-5 s after the kill. AwaitPromotion waits
// for that; Rejoin starts the dead node again, as a supervisor would, and
// waits until it serves as the new master's replica.

// AwaitPromotion waits (up to 30 s) until the cluster itself has promoted
// the first replica of master i, which the test has killed (or frozen):
// the replica is a master, and every node that answers reports
// cluster_state:ok and the slot map with it in place (the dead node listed
// nowhere). It returns the new master. Afterwards Masters[i] is the new
// master and the dead node is in its place in Replicas, as after Failover.
func (c *Cluster) AwaitPromotion(t TB, i int) *Server {
	t.Helper()
	if i < 0 || i >= len(c.Masters) || c.perMaster == 0 {
		t.Fatalf("redistest: promotion for master %d: no such master or it has no replica", i)
		return nil
	}
	if c.Masters[i].answers() {
		t.Fatalf("redistest: promotion for master %d: %s still answers; kill or freeze it first", i, c.Masters[i].Addr)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	ri := i * c.perMaster
	c.Masters[i], c.Replicas[ri] = c.Replicas[ri], c.Masters[i]
	if err := c.waitLive(ctx); err != nil {
		t.Fatalf("%v (after the kill of master %d)\n%s", err, i, c.describe())
		return nil
	}
	return c.Masters[i]
}

// Rejoin starts a cluster node the test killed again, on its port and with
// its files (nodes.conf says which cluster it was in), and waits (up to
// 30 s) until the whole cluster is as the layout says: a master that lost
// its slots while down rejoins as a replica of the node that took them
// over (see AwaitPromotion).
func (c *Cluster) Rejoin(t TB, s *Server) {
	t.Helper()
	s.Restart(t)
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("%v (after %s rejoined)\n%s", err, s.Addr, c.describe())
	}
}

// waitLive is waitOK for a cluster with nodes down: it checks the nodes
// that answer only, against the slot map without them.
func (c *Cluster) waitLive(ctx context.Context) error {
	var live []*Server
	for _, n := range c.nodes() {
		if n.answers() {
			live = append(live, n)
		}
	}
	return c.waitNodes(ctx, live, c.wantShards((*Server).answers))
}

// answers reports whether the server runs and is not frozen.
func (s *Server) answers() bool {
	s.mu.Lock()
	frozen := s.frozen
	s.mu.Unlock()
	return !frozen && s.Running()
}
