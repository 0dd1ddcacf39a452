//go:build integration

package redistest

import (
	"context"
	"strings"
	"testing"
)

// TestClusterMasterKilled: a master killed, its replica promoted by the
// cluster itself (AwaitPromotion), its keys kept; then the dead node
// started again rejoins as the new master's replica (Rejoin).
func TestClusterMasterKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartDurableCluster(t, 3, 1)
	setKeys(ctx, t, c.Client(t), 30)
	if n, err := c.Masters[1].Client(t).Do(ctx, "wait", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}

	dead := c.Masters[1]
	dead.Kill()
	nm := c.AwaitPromotion(t, 1)
	if nm == dead || c.Masters[1] != nm || c.Replicas[1] != dead {
		t.Fatalf("layout not updated: new %s, Masters[1] %s, Replicas[1] %s", nm.Addr, c.Masters[1].Addr, c.Replicas[1].Addr)
	}
	if role := role(ctx, t, nm); role != "master" {
		t.Fatalf("new master role = %q", role)
	}
	keys, err := nm.Client(t).DBSize(ctx).Result()
	if err != nil || keys == 0 {
		t.Fatalf("the new master holds %d keys (%v), want the dead one's", keys, err)
	}

	c.Rejoin(t, dead)
	if role := role(ctx, t, dead); role != "slave" {
		t.Fatalf("the rejoined node's role = %q, want slave", role)
	}
	if got, err := dead.Client(t).DBSize(ctx).Result(); err != nil || got != keys {
		t.Fatalf("the rejoined node holds %d keys (%v), want its master's %d", got, err, keys)
	}
}

// TestAwaitPromotionOfRunningMaster: a master that was not killed has no
// promotion to wait for.
func TestAwaitPromotionOfRunningMaster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3, 1)
	msg := fatalMessage(t, func(tb TB) { c.AwaitPromotion(tb, 0) })
	if !strings.Contains(msg, "still answers; kill or freeze it first") {
		t.Errorf("AwaitPromotion of a running master: %q", msg)
	}
}
