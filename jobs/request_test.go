package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// TestRequestCarriesTenantAndWeight: the admission a job makes is in its
// notification's tenant, weighed by Throttle.Weights (1 when it has no
// entry, the default tenant's included), and a Swap brings new weights.
func TestRequestCarriesTenantAndWeight(t *testing.T) {
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 10, 1)
	th := &Throttle{
		Rules:  Rules{Policies: map[string]*throttle.Quota{"mkt": q}, Providers: map[string]Route{"gw": {Bucket: b}}, Weights: map[string]int{"billing": 3}},
		Pacing: Pacing{Book: true},
	}
	var booked bool
	request := func(tenant string) throttle.Booking {
		t.Helper()
		j, err := th.route(context.Background(), "id", message.Notification{Recipient: "a", Policy: "mkt", Provider: "gw", Template: "t", Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		booked = j.book
		return j.booking(false)
	}
	tests := []struct {
		tenant string
		weight int
	}{{"billing", 3}, {"growth", 1}, {"", 1}}
	for _, tc := range tests {
		if b := request(tc.tenant); b.Tenant != tc.tenant || b.Weight != tc.weight || !booked {
			t.Errorf("tenant %q: booking in tenant %q of weight %d (book %v), want weight %d", tc.tenant, b.Tenant, b.Weight, booked, tc.weight)
		}
	}
	th.Swap(Rules{Policies: th.Policies, Providers: th.Providers, Weights: map[string]int{"growth": 7}})
	if b := request("growth"); b.Weight != 7 {
		t.Errorf("after Swap, growth weighs %d, want 7", b.Weight)
	}
	if b := request("billing"); b.Weight != 1 {
		t.Errorf("after Swap, billing weighs %d, want 1 (no entry)", b.Weight)
	}
}

// A job that books asks for its horizon, and is back from its place in
// line once its task's header says a booking placed it there.
func TestRequestBookAhead(t *testing.T) {
	b, _ := throttle.NewBucket("gw", 10, 1)
	j := job{id: "t1", queue: "low", book: true, bookAhead: 5 * time.Second, route: Route{Bucket: b},
		n: message.Notification{Recipient: "a", Provider: "gw"}, headers: message.Headers()}
	if bk := j.booking(false); bk.Horizon != 5*time.Second || bk.Back {
		t.Errorf("horizon %s, back %v; want 5s, not back", bk.Horizon, bk.Back)
	}
	j.inLine()
	if bk := j.booking(false); !bk.Back || j.headers[message.LineHeader] != "1" {
		t.Errorf("placed in line: back %v, header %q; want back, \"1\"", bk.Back, j.headers[message.LineHeader])
	}
	j.bookAhead = 0
	if bk := j.booking(false); bk.Horizon != 0 {
		t.Errorf("without a horizon: horizon %s, want none", bk.Horizon)
	}
	j.headers = nil // a task enqueued without headers cannot keep a place: it never joins a line's end
	if bk := j.booking(false); !bk.Back {
		t.Errorf("a task without headers: back %v, want back", bk.Back)
	}
}

// Sends are counted by tenant only for the tenants the weights name.
func TestTenantLabelIsBounded(t *testing.T) {
	th := &Throttle{Rules: Rules{Weights: map[string]int{"billing": 2}}}
	for tenant, want := range map[string]string{"billing": "billing", "": "default", "growth": "other", "team-4711": "other"} {
		if got := th.tenantLabel(tenant); got != want {
			t.Errorf("tenant %q counted as %q, want %q", tenant, got, want)
		}
	}
}
