package redistest

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	clusterTimeout  = 30 * time.Second
	clusterPoll     = 50 * time.Millisecond
	failoverReissue = 5 * time.Second
	slotCount       = 16384
)

// Cluster is a Redis Cluster of redis-server processes. Masters[i] serves
// the i-th even share of the slots, its replicas being Replicas[i*r :
// (i+1)*r]; a failover swaps the promoted replica and the old master.
type Cluster struct {
	Masters  []*Server
	Replicas []*Server

	perMaster int
}

// StartCluster starts masters (>= 3) masters with replicasPerMaster
// replicas each and waits (up to clusterTimeout) until every node reports
// cluster_state:ok and the full slot map, and every replica's link is up.
func StartCluster(t TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	return startCluster(t, masters, replicasPerMaster, &security{})
}

// startCluster starts a cluster whose nodes are set up as sec says; in the
// quick tier it skips the test.
func startCluster(t TB, masters, replicasPerMaster int, sec *security) *Cluster {
	t.Helper()
	if s, ok := t.(interface{ Skip(...any) }); ok && !integrationTier {
		s.Skip("a Redis Cluster: runs with -tags integration (make test)")
	}
	if masters < 3 || replicasPerMaster < 0 {
		t.Fatalf("redistest: cluster needs >= 3 masters and >= 0 replicas per master, got %d and %d",
			masters, replicasPerMaster)
		return nil
	}
	c := &Cluster{perMaster: replicasPerMaster}
	for range masters {
		c.Masters = append(c.Masters, start(t, true, sec))
	}
	for range masters * replicasPerMaster {
		c.Replicas = append(c.Replicas, start(t, true, sec))
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.setup(ctx); err != nil {
		t.Fatalf("%v\n%s", err, c.describe())
		return nil
	}
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("%v\n%s", err, c.describe())
		return nil
	}
	return c
}

// Addrs returns the master addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}

// Client returns a client of the cluster, closed at cleanup, logged in as
// Server.Client is.
func (c *Cluster) Client(t TB) *redis.ClusterClient {
	t.Helper()
	m := c.Masters[0]
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:     c.Addrs(),
		Username:  m.access.user,
		Password:  m.access.password,
		TLSConfig: m.access.tls.Clone(),
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Failover makes the first replica of master i take over (CLUSTER
// FAILOVER), waits until every node sees the new roles, and returns the new
// master, now Masters[i].
func (c *Cluster) Failover(t TB, i int) *Server {
	t.Helper()
	if i < 0 || i >= len(c.Masters) || c.perMaster == 0 {
		t.Fatalf("redistest: failover of master %d: no such master or it has no replica", i)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	ri := i * c.perMaster
	replica := c.Replicas[ri]
	if err := promote(ctx, replica); err != nil {
		t.Fatalf("%v\n%s", err, c.describe())
		return nil
	}
	c.Masters[i], c.Replicas[ri] = replica, c.Masters[i]
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("%v (after failover of master %d)\n%s", err, i, c.describe())
		return nil
	}
	return replica
}

// nodes returns all servers, masters first.
func (c *Cluster) nodes() []*Server {
	return append(append([]*Server{}, c.Masters...), c.Replicas...)
}

// masterOf returns the master that replica index j should follow.
func (c *Cluster) masterOf(j int) *Server {
	return c.Masters[j/c.perMaster]
}

// setup assigns slots and config epochs, joins the nodes and makes the
// replicas replicate their masters.
func (c *Cluster) setup(ctx context.Context) error {
	nodes := c.nodes()
	admins := dialAll(nodes)
	defer closeAll(admins)
	for k, n := range nodes {
		if err := initNode(ctx, admins[n], n, k+1); err != nil {
			return err
		}
	}
	for i, m := range c.Masters {
		lo, hi := slotRange(i, len(c.Masters))
		if err := admins[m].Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			return fmt.Errorf("redistest: addslotsrange %d-%d on %s: %w", lo, hi, m.Addr, err)
		}
	}
	first := admins[nodes[0]]
	for _, n := range nodes[1:] {
		if err := first.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.Port)).Err(); err != nil {
			return fmt.Errorf("redistest: cluster meet %s: %w", n.Addr, err)
		}
	}
	for j, r := range c.Replicas {
		m := c.masterOf(j)
		// REPLICATE fails with "Unknown node" until gossip has told r about m.
		err := poll(ctx, clusterPoll, func() error {
			return admins[r].ClusterReplicate(ctx, m.id).Err()
		})
		if err != nil {
			return fmt.Errorf("redistest: %s replicate %s: %w", r.Addr, m.Addr, err)
		}
	}
	return nil
}

// initNode records the node's ID and gives it a config epoch of its own,
// so that the masters need not resolve collisions after meeting.
func initNode(ctx context.Context, admin *redis.Client, n *Server, epoch int) error {
	id, err := admin.ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("redistest: cluster myid on %s: %w", n.Addr, err)
	}
	n.id = id
	if err := admin.Do(ctx, "cluster", "set-config-epoch", epoch).Err(); err != nil {
		return fmt.Errorf("redistest: set-config-epoch on %s: %w", n.Addr, err)
	}
	return nil
}

// promote issues CLUSTER FAILOVER on the replica, again if an attempt timed
// out, until it is a master.
func promote(ctx context.Context, replica *Server) error {
	admin := dial(replica)
	defer admin.Close()
	var issued time.Time
	err := poll(ctx, clusterPoll, func() error {
		if time.Since(issued) > failoverReissue {
			if err := admin.ClusterFailover(ctx).Err(); err != nil {
				return fmt.Errorf("cluster failover: %w", err)
			}
			issued = time.Now()
		}
		return checkRole(ctx, admin, nil)
	})
	if err != nil {
		return fmt.Errorf("redistest: promote %s: %w", replica.Addr, err)
	}
	return nil
}

func slotRange(i, n int) (lo, hi int) {
	return i * slotCount / n, (i+1)*slotCount/n - 1
}

// dial returns an admin client of one node that fails fast.
func dial(s *Server) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:            s.Addr,
		Username:        s.access.user,
		Password:        s.access.password,
		TLSConfig:       s.access.tls.Clone(),
		DialTimeout:     time.Second,
		ReadTimeout:     2 * time.Second,
		MaxRetries:      -1,
		PoolSize:        1,
		DisableIdentity: true,
	})
}

func dialAll(nodes []*Server) map[*Server]*redis.Client {
	admins := make(map[*Server]*redis.Client, len(nodes))
	for _, n := range nodes {
		admins[n] = dial(n)
	}
	return admins
}

func closeAll(admins map[*Server]*redis.Client) {
	for _, a := range admins {
		_ = a.Close()
	}
}

// poll calls f every interval until it returns nil or ctx ends.
func poll(ctx context.Context, interval time.Duration, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(interval):
		}
	}
}
