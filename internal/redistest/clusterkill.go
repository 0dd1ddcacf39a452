package redistest

import (
	"context"
)

// AwaitPromotion waits (up to clusterTimeout) until the cluster itself has
// promoted the first replica of master i, which the test killed or froze,
// and every node that answers agrees. It returns the new master, now
// Masters[i], as after Failover.
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

// Rejoin starts a node the test killed again, with its port and files, as
// a supervisor would, and waits until the cluster is as the layout says: a
// master replaced while down rejoins as its replica's replica.
func (c *Cluster) Rejoin(t TB, s *Server) {
	t.Helper()
	s.Restart(t)
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("%v (after %s rejoined)\n%s", err, s.Addr, c.describe())
	}
}

// waitLive is waitOK for the nodes that answer, against the slot map
// without the others.
func (c *Cluster) waitLive(ctx context.Context) error {
	var live []*Server
	for _, n := range c.nodes() {
		if n.answers() {
			live = append(live, n)
		}
	}
	return c.waitNodes(ctx, live, c.wantShards((*Server).answers))
}

func (s *Server) answers() bool {
	s.mu.Lock()
	frozen := s.frozen
	s.mu.Unlock()
	return !frozen && s.Running()
}
