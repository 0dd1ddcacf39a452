package digest

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
)

// shared is the redis-server the package's tests share, each test in a
// database of its own.
var shared *redistest.Shared

func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }

// TestDigestCarriesTenant: a digest's task carries the tenant of the fold
// that queued it, which is no part of the digest's name (its keys and task
// ID): folds of several tenants share one digest.
func TestDigestCarriesTenant(t *testing.T) {
	n := message.Notification{Recipient: "a", Policy: "mkt", Provider: "gw", Template: "t", Tenant: "billing"}
	d := refOf(n)
	payload, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var back Ref
	if err := json.Unmarshal(payload, &back); err != nil || back.Tenant != "billing" {
		t.Fatalf("digest task payload %s: tenant %q, %v", payload, back.Tenant, err)
	}
	n.Tenant = ""
	other := refOf(n)
	g := New(nil, "", nil)
	gen, ids, list := g.keys(d)
	gen2, ids2, list2 := g.keys(other)
	if other.TaskID() != d.TaskID() || gen != gen2 || ids != ids2 || list != list2 {
		t.Errorf("the tenant changes the digest's name")
	}
}

// TestDigestFoldIsIdempotent checks the fold's state: a task folded again
// stays once in its digest, a sealed digest takes no more, a folded task is
// found folded and a tried one tried.
func TestDigestFoldIsIdempotent(t *testing.T) {
	rdb := shared.Server.ClientOn(t, shared.DB(t))
	g := New(rdb, "", nil)
	ctx := context.Background()
	n := message.Notification{Recipient: "alice", Policy: "mkt", Provider: "gw", Template: "t"}
	d1, err := g.Fold(ctx, "a", n, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	again, err := g.Fold(ctx, "a", n, time.Now())
	if err != nil || again != d1 {
		t.Fatalf("a folded again: %+v, %v; want %+v", again, err, d1)
	}
	if size, _ := g.Size(ctx, d1); size != 1 {
		t.Fatalf("digest holds %d after folding a twice, want 1", size)
	}
	if _, _, err := g.Seal(ctx, d1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Seal(ctx, d1); err != nil {
		t.Fatal(err)
	}
	d2, err := g.Fold(ctx, "b", n, time.Now())
	if err != nil || d2.Gen != d1.Gen+1 {
		t.Fatalf("b folded after the seal: %+v, %v; want digest %d", d2, err, d1.Gen+1)
	}
	if d, ok, tried, err := g.State(ctx, "a", n); err != nil || !ok || tried || d != d1 {
		t.Errorf("a found folded in %+v, %v, tried %v, %v; want %+v, not tried", d, ok, tried, err, d1)
	}
	if err := g.Attempt(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, ok, tried, _ := g.State(ctx, "c", n); ok || !tried {
		t.Errorf("c, never folded but tried: found folded %v, tried %v", ok, tried)
	}
}
