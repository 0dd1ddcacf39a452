package api

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// eventsOf returns the types of a GET answer's events, and fails the test
// unless each has its ID, its message, its tenant and its time.
func eventsOf(t *testing.T, r response, id, key string) []string {
	t.Helper()
	raw, _ := r.body["events"].([]any)
	var types []string
	for _, x := range raw {
		e := x.(map[string]any)
		types = append(types, e["type"].(string))
		if k, _ := e["idempotency_key"].(string); e["message"] != id || e["tenant"] != "billing" || len(e["id"].(string)) != 32 || e["at"] == nil || k != key {
			t.Errorf("event %v: want its ID, message %s, tenant billing, its time and key %q", e, id, key)
		}
	}
	return types
}

// worker records what a worker records of message id, on f's Redis.
func (f *fixture) worker(t *testing.T, events ...lifecycle.Event) {
	t.Helper()
	if err := lifecycle.NewRecorder(f.rdb, testConfig().EventOptions()).Record(context.Background(), events...); err != nil {
		t.Fatal(err)
	}
}

// TestGetListsTheHistory: GET lists a notification's events in order, its
// accepted event first (with the key as the client gave it), each with
// that key, whether asked by ID or by key.
func TestGetListsTheHistory(t *testing.T) {
	f := newFixture(t)
	r := f.post(billingKey, welcome, "Idempotency-Key", "welcome-alice")
	id := r.body["id"].(string)
	moment := time.Now().Add(time.Hour)
	f.worker(t, lifecycle.Event{Type: lifecycle.Booked, Message: id, Tenant: "billing", Moment: &moment, Rule: "policy marketing (1 per 1h)"},
		lifecycle.Event{Type: lifecycle.Sent, Message: id, Tenant: "billing", Provider: "console"})
	for _, path := range []string{id, "welcome-alice"} {
		got := f.do(http.MethodGet, "/v1/notifications/"+path, billingKey, "")
		if types := eventsOf(t, got, id, "welcome-alice"); got.status != http.StatusOK || !slices.Equal(types, []string{"accepted", "booked", "sent"}) {
			t.Errorf("GET %s = %d, events %v; want 200 and accepted, booked, sent", path, got.status, types)
		}
	}
	if other := f.do(http.MethodGet, "/v1/notifications/"+id, growthKey, ""); other.status != http.StatusNotFound {
		t.Errorf("another tenant's GET = %d %v, want 404", other.status, other.body)
	}
	if post := f.post(billingKey, welcome, "Idempotency-Key", "welcome-alice"); post.body["events"] != nil {
		t.Errorf("POST's answer %v: events are GET's alone", post.body)
	}
}

// TestGetTellsHowAnEndedMessageEnded: once its task is gone (one without a
// key is dropped when done) and its sent marker too, GET still tells how
// it ended, from its history, to its tenant alone.
func TestGetTellsHowAnEndedMessageEnded(t *testing.T) {
	f := newFixture(t)
	sent, dropped := f.post(billingKey, welcome).body["id"].(string), f.post(billingKey, welcome).body["id"].(string)
	f.worker(t, lifecycle.Event{Type: lifecycle.Sent, Message: sent, Tenant: "billing", Provider: "console"},
		lifecycle.Event{Type: lifecycle.Dropped, Message: dropped, Tenant: "billing", Rule: "policy marketing (1 per 1h)"})
	for _, id := range []string{sent, dropped} {
		if err := f.insp.DeleteTask("default", id); err != nil {
			t.Fatal(err)
		}
	}
	got := f.do(http.MethodGet, "/v1/notifications/"+sent, billingKey, "")
	if types := eventsOf(t, got, sent, ""); got.status != http.StatusOK || got.body["state"] != "sent" || got.body["sent_at"] == nil ||
		!slices.Equal(types, []string{"accepted", "sent"}) {
		t.Errorf("GET of a sent one gone = %d %v, want 200 sent, with sent_at and its events", got.status, got.body)
	}
	got = f.do(http.MethodGet, "/v1/notifications/"+dropped, billingKey, "")
	if got.status != http.StatusOK || got.body["state"] != "archived" || got.body["reason"] != "dropped: over policy marketing (1 per 1h)" {
		t.Errorf("GET of a dropped one gone = %d %v, want 200 archived, dropped", got.status, got.body)
	}
	if other := f.do(http.MethodGet, "/v1/notifications/"+sent, growthKey, ""); other.status != http.StatusNotFound {
		t.Errorf("another tenant's GET = %d %v, want 404", other.status, other.body)
	}
}

// TestCancelIsAnEvent: DELETE records the canceled event, once however
// often it is asked.
func TestCancelIsAnEvent(t *testing.T) {
	f := newFixture(t)
	id := f.post(billingKey, welcome).body["id"].(string)
	for range 2 {
		if r := f.do(http.MethodDelete, "/v1/notifications/"+id, billingKey, ""); r.status != http.StatusOK {
			t.Fatalf("DELETE = %d %v", r.status, r.body)
		}
	}
	got := f.do(http.MethodGet, "/v1/notifications/"+id, billingKey, "")
	if types := eventsOf(t, got, id, ""); !slices.Equal(types, []string{"accepted", "canceled"}) {
		t.Errorf("events %v, want accepted, canceled", types)
	}
}
