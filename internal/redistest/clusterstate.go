package redistest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// shard is one slot range with its master and sorted replicas, as the
// layout wants it or CLUSTER SLOTS shows it.
type shard struct {
	lo, hi   int
	master   string
	replicas string // sorted, comma-separated
}

// waitOK waits until every node reports cluster_state:ok, the slot map and
// the role the layout gives it, and every replica's link is up.
func (c *Cluster) waitOK(ctx context.Context) error {
	return c.waitNodes(ctx, c.nodes(), c.wantShards(func(*Server) bool { return true }))
}

func (c *Cluster) waitNodes(ctx context.Context, nodes []*Server, want []shard) error {
	admins := dialAll(nodes)
	defer closeAll(admins)
	err := poll(ctx, clusterPoll, func() error {
		for _, n := range nodes {
			if err := c.checkNode(ctx, admins[n], n, want); err != nil {
				return fmt.Errorf("node %s: %w", n.Addr, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redistest: cluster not ready: %w", err)
	}
	return nil
}

func (c *Cluster) checkNode(ctx context.Context, admin *redis.Client, n *Server, want []shard) error {
	info, err := admin.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster info: %w", err)
	}
	if state := infoField(info, "cluster_state"); state != "ok" {
		return fmt.Errorf("cluster_state is %q", state)
	}
	//lint:ignore SA1019 go-redis's ClusterClient routes by CLUSTER SLOTS, so that is the view to wait for.
	slots, err := admin.ClusterSlots(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster slots: %w", err)
	}
	if got := gotShards(slots); !slices.Equal(got, want) {
		return fmt.Errorf("slot map %v, want %v", got, want)
	}
	return checkRole(ctx, admin, c.wantMaster(n))
}

// checkRole checks that the node is a master if master is nil, else a
// replica of master with its link up.
func checkRole(ctx context.Context, admin *redis.Client, master *Server) error {
	info, err := admin.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("info replication: %w", err)
	}
	role := infoField(info, "role")
	if master == nil {
		if role != "master" {
			return fmt.Errorf("role is %q, want master", role)
		}
		return nil
	}
	if role != "slave" || infoField(info, "master_port") != strconv.Itoa(master.Port) {
		return fmt.Errorf("role is %q of port %s, want replica of %s",
			role, infoField(info, "master_port"), master.Addr)
	}
	if link := infoField(info, "master_link_status"); link != "up" {
		return fmt.Errorf("master link is %q", link)
	}
	return nil
}

// wantMaster returns the master n should replicate, or nil if n is a master.
func (c *Cluster) wantMaster(n *Server) *Server {
	if j := slices.Index(c.Replicas, n); j >= 0 {
		return c.masterOf(j)
	}
	return nil
}

// wantShards returns the slot map the layout implies, with the replicas
// listed that pass listed: CLUSTER SLOTS does not list a failed node.
func (c *Cluster) wantShards(listed func(*Server) bool) []shard {
	want := make([]shard, len(c.Masters))
	for i, m := range c.Masters {
		var replicas []string
		for _, r := range c.Replicas[i*c.perMaster : (i+1)*c.perMaster] {
			if listed(r) {
				replicas = append(replicas, r.Addr)
			}
		}
		lo, hi := slotRange(i, len(c.Masters))
		want[i] = newShard(lo, hi, m.Addr, replicas)
	}
	return want
}

func gotShards(slots []redis.ClusterSlot) []shard {
	got := make([]shard, 0, len(slots))
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		var replicas []string
		for _, r := range s.Nodes[1:] {
			replicas = append(replicas, r.Addr)
		}
		got = append(got, newShard(s.Start, s.End, s.Nodes[0].Addr, replicas))
	}
	slices.SortFunc(got, func(a, b shard) int { return a.lo - b.lo })
	return got
}

func newShard(lo, hi int, master string, replicas []string) shard {
	slices.Sort(replicas)
	return shard{lo: lo, hi: hi, master: master, replicas: strings.Join(replicas, ",")}
}

func (s shard) String() string {
	return fmt.Sprintf("%d-%d:%s[%s]", s.lo, s.hi, s.master, s.replicas)
}

func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// describe lists the nodes with their log tails, for failure messages.
func (c *Cluster) describe() string {
	var b strings.Builder
	for _, n := range c.nodes() {
		role := "master"
		if m := c.wantMaster(n); m != nil {
			role = "replica of " + m.Addr
		}
		fmt.Fprintf(&b, "== %s (%s, id %.8s, running %t)\n%s",
			n.Addr, role, n.id, n.Running(), logTail(n.Dir, 5))
	}
	return b.String()
}
