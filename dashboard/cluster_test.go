//go:build integration

package dashboard

import (
	"net/http"
	"testing"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// TestOnCluster: every view answers on a Redis Cluster, where a
// recipient's keys and a provider's live on different nodes, and the
// recipient's next moment is the engine's.
func TestOnCluster(t *testing.T) {
	e := newEnv(t, "", redistest.StartCluster(t, 3, 0).Client(t))
	e.admit(t, "first", "alice@example.com", "marketing", "sms")
	d := e.admit(t, "second", "alice@example.com", "marketing", "sms")
	if d.Allowed() {
		t.Fatal("second admission allowed")
	}
	for _, p := range []string{"/throttle?recipient=alice@example.com", "/throttle/api/providers", "/throttle/api/policies",
		"/throttle/api/campaigns", "/monitoring/api/queues", "/monitoring/api/redis_info"} {
		if code, body := e.get(t, p); code != http.StatusOK {
			t.Errorf("GET %s on a cluster: %d %.200s", p, code, body)
		}
	}
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/alice@example.com", &r)
	for _, p := range r.Policies {
		if p.Policy == "marketing" && (!p.Next.Equal(d.At()) || p.DecidedBy != "1 per 24h") {
			t.Errorf("next %s by %q, want the engine's %s by 1 per 24h", p.Next, p.DecidedBy, d.At())
		}
	}
	var prov page[providerView]
	e.getJSON(t, "/throttle/api/providers", &prov)
	if prov.Total != 3 || len(prov.Items) != 3 {
		t.Errorf("providers on a cluster: %+v", prov)
	}
}
