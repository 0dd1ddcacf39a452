//go:build integration

package redisconn_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// followWithin is how long after its replica's promotion a client from
// Connect may still miss a dead master's keys: a few reload gaps and
// retries. go-redis alone misses them until its periodic reload, up to a
// minute after the kill.
const followWithin = 10 * time.Second

// TestClusterClientFollowsKilledMaster: a master killed with SIGKILL and
// left down, its replica promoted by the cluster; the client, which kept
// calling the dead master through the outage as a worker does, reaches
// the key on the new master soon after the promotion.
func TestClusterClientFollowsKilledMaster(t *testing.T) {
	t.Parallel()
	followRun(t, (*redistest.Server).Kill)
}

// followRun is one run of the tests above: fail makes master 0 fail.
func followRun(t *testing.T, fail func(*redistest.Server)) {
	c := redistest.StartCluster(t, 3, 1)
	ctx := context.Background()
	rdb, closeRedis, err := redisconn.Connect(ctx, redisconn.Config{Cluster: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeRedis()
	key := keyOn(t, rdb.(*redis.ClusterClient), c.Masters[0].Addr)
	if err := rdb.Set(ctx, key, "kept", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Masters[0].Client(t).Do(ctx, "wait", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 { // callers that keep failing through the outage
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
					_ = rdb.Get(ctx, key).Err()
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	dead := c.Masters[0]
	fail(dead)
	killed := time.Now()
	promoted := c.AwaitPromotion(t, 0)
	promotedAfter := time.Since(killed)
	for {
		v, err := rdb.Get(ctx, key).Result()
		if err == nil {
			if v != "kept" {
				t.Fatalf("GET %s on the new master = %q, want %q", key, v, "kept")
			}
			break
		}
		if time.Since(killed) > promotedAfter+followWithin {
			t.Fatalf("%s after %s (the dead master) was replaced by %s, GET %s still fails: %v",
				time.Since(killed)-promotedAfter, dead.Addr, promoted.Addr, key, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%s failed: its replica %s promoted %s after it, the key served again %s after it",
		dead.Addr, promoted.Addr, promotedAfter.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// keyOn returns a key whose slot the master at addr serves.
func keyOn(t *testing.T, cc *redis.ClusterClient, addr string) string {
	t.Helper()
	for i := range 1000 {
		key := fmt.Sprintf("failover-%d", i)
		m, err := cc.MasterForKey(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == addr {
			return key
		}
	}
	t.Fatalf("no key of 1000 on %s", addr)
	return ""
}

// TestClusterClientFollowsFrozenMaster: as TestClusterClientFollowsKilledMaster
// for a master that stops answering without closing anything (SIGSTOP: a
// hung host, a partition), so that calls to it time out instead of being
// refused.
func TestClusterClientFollowsFrozenMaster(t *testing.T) {
	t.Parallel()
	followRun(t, func(s *redistest.Server) { s.Freeze(t) })
}
