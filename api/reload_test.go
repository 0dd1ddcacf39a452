package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

// TestReloadTakesNewKeysAndPolicies: after Reload, a key and a policy the
// new config added are taken and a key it removed is refused, without a
// restart.
func TestReloadTakesNewKeysAndPolicies(t *testing.T) {
	rdb, _ := shared.NewClient(t)
	cfg := testConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	lim, err := throttle.New(rdb, throttle.Options{Prefix: cfg.Redis.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Config: cfg, Redis: rdb, Limiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, rdb: rdb, srv: newServer(t, s)}
	const newKey = "ops-0123456789abcdef"
	vip := `{"recipient":"a@example.com","template":"t","policy":"vip"}`
	if r := f.post(newKey, welcome); r.status != http.StatusUnauthorized {
		t.Fatalf("a key not yet added = %d, want 401", r.status)
	}
	if r := f.post(billingKey, vip); r.status != http.StatusBadRequest {
		t.Fatalf("a policy not yet added = %d, want 400", r.status)
	}

	next := testConfig()
	next.Policies["vip"] = config.Policy{Windows: []throttle.Window{{Limit: 5, Per: time.Hour}}, OverCap: config.OverCapDefer}
	next.API.Keys["ops"] = config.APIKey{Key: newKey, Tenant: "ops", Rate: 10, Burst: 10}
	delete(next.API.Keys, "slow")
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	if r := f.post(newKey, welcome); r.status != http.StatusAccepted || r.body["tenant"] != "ops" {
		t.Errorf("the added key = %d %v, want 202 as tenant ops", r.status, r.body)
	}
	if r := f.post(billingKey, vip); r.status != http.StatusAccepted {
		t.Errorf("the added policy = %d %v, want 202", r.status, r.body)
	}
	if r := f.post(slowKey, welcome); r.status != http.StatusUnauthorized {
		t.Errorf("the removed key = %d, want 401", r.status)
	}
}
