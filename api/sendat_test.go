package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/intake"
)

// TestScheduled: a notification given send_at is accepted as scheduled for
// its moment, GET and the list say so, and DELETE before the moment
// cancels it: a worker running past the moment runs the other one
// scheduled for the same second, at or after it, and never the canceled.
func TestScheduled(t *testing.T) {
	f := newFixture(t)
	at := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second)
	moment := at.Format(time.RFC3339)
	body := func(to string) string {
		return fmt.Sprintf(`{"recipient":%q,"template":"reminder","send_at":%q}`, to, moment)
	}
	r := f.post(billingKey, body("alice@example.com"))
	if r.status != http.StatusAccepted || r.body["state"] != "scheduled" || r.body["send_at"] != moment || r.body["until"] != moment {
		t.Fatalf("POST = %d %v, want 202, state scheduled, send_at and until %s", r.status, r.body, moment)
	}
	canceled := r.body["id"].(string)
	kept := f.post(billingKey, body("bob@example.com")).body["id"].(string)
	got := f.do(http.MethodGet, "/v1/notifications/"+canceled, billingKey, "")
	if got.body["state"] != "scheduled" || got.body["send_at"] != moment || got.body["until"] != moment {
		t.Errorf("GET = %v, want scheduled for %s", got.body, moment)
	}
	if types := eventsOf(t, got, canceled, ""); !slices.Equal(types, []string{"accepted", "scheduled"}) ||
		got.body["events"].([]any)[1].(map[string]any)["moment"] != moment {
		t.Errorf("GET's events = %v, want accepted, then scheduled at %s", got.body["events"], moment)
	}
	if ids, states, _ := f.page(t, billingKey, url.Values{"state": {"scheduled"}}); len(ids) != 2 || states[0] != "scheduled" {
		t.Errorf("the list of the scheduled: %v %v, want both", ids, states)
	}

	del := f.do(http.MethodDelete, "/v1/notifications/"+canceled, billingKey, "")
	if del.status != http.StatusOK || del.body["state"] != "canceled" || del.body["until"] != nil {
		t.Fatalf("DELETE before the moment = %d %v, want 200 canceled", del.status, del.body)
	}
	if time.Now().After(at) {
		t.Fatalf("canceled after its moment: the test ran too slow to show anything")
	}

	var mu sync.Mutex
	ran := map[string]time.Time{}
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{
		Queues: map[string]int{"default": 1}, TaskCheckInterval: 10 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond, LogLevel: asynq.FatalLevel,
	})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		defer mu.Unlock()
		ran[id] = time.Now()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	// Both wait in one sorted set at one score: the pass that moves the
	// kept one would move the canceled one too.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		_, done := ran[kept]
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduled notification never ran")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if ran[kept].Before(at) {
		t.Errorf("the scheduled one ran at %s, before its moment %s", ran[kept].Format(time.StampMilli), moment)
	}
	if when, ok := ran[canceled]; ok {
		t.Errorf("the canceled one ran at %s", when.Format(time.StampMilli))
	}
	if r := f.do(http.MethodGet, "/v1/notifications/"+canceled, billingKey, ""); r.body["state"] != "canceled" || r.body["send_at"] != moment {
		t.Errorf("GET of the canceled one after its moment = %v, want canceled, its send_at kept", r.body)
	}
}

// TestScheduledLocal: send_at_local is the next such time of day in the
// notification's zone; GET says the instant.
func TestScheduledLocal(t *testing.T) {
	f := newFixture(t)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	const body = `{"recipient":"alice@example.com","template":"t","send_at_local":"09:00","tz":"Europe/Paris"}`
	before := time.Now()
	r := f.post(billingKey, body, IdempotencyHeader, "nine")
	after := time.Now()
	first, _ := intake.NextLocal("09:00", paris, before)
	last, _ := intake.NextLocal("09:00", paris, after)
	at, _ := time.Parse(time.RFC3339, fmt.Sprint(r.body["send_at"]))
	if r.status != http.StatusAccepted || r.body["state"] != "scheduled" || !at.Equal(first) && !at.Equal(last) {
		t.Fatalf("POST = %d %v, want 202 scheduled for %s", r.status, r.body, first)
	}
	info, err := f.insp.GetTaskInfo("default", r.body["id"].(string))
	if err != nil || info.State != asynq.TaskStateScheduled || !info.NextProcessAt.Equal(at) {
		t.Errorf("task %v (%v), want asynq holding it until %s", info, err, at)
	}
	// The same again, its moment the same: the original.
	again := f.post(billingKey, body, IdempotencyHeader, "nine")
	if next, _ := intake.NextLocal("09:00", paris, time.Now()); !next.Equal(first) {
		t.Logf("09:00 in Paris passed while the test ran: the replay is not compared")
	} else if again.status != http.StatusOK || again.body["id"] != r.body["id"] || again.body["state"] != "scheduled" {
		t.Errorf("the same again = %d %v, want 200, the original, scheduled", again.status, again.body)
	}
}

// TestScheduleRefusedOverHTTP: a bad moment is a 400 pointing at its field,
// and nothing is enqueued.
func TestScheduleRefusedOverHTTP(t *testing.T) {
	f := newFixture(t)
	soon, later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339), time.Now().Add(2*time.Hour).UTC().Format(time.RFC3339)
	cases := []struct {
		name, fields, field, inMessage string
	}{
		{"a moment past", `"send_at":"2001-01-01T00:00:00Z"`, "/send_at", "is in the past (more than 1m ago)"},
		{"an unknown zone", `"send_at_local":"09:00","tz":"Mars/Olympus"`, "/tz", "unknown time zone"},
		{"both forms", `"send_at":"` + soon + `","send_at_local":"09:00"`, "/send_at_local", "given with send_at"},
		{"a malformed time of day", `"send_at_local":"9:00"`, "/send_at_local", "must be a time of day HH:MM"},
		{"after the send-by", `"send_at":"` + later + `","send_by":"` + soon + `"`, "/send_at", "is after send_by"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.post(billingKey, `{"recipient":"a@example.com","template":"t",`+c.fields+`}`)
			code, field := r.errorOf(t)
			msg := r.body["error"].(map[string]any)["message"].(string)
			if r.status != http.StatusBadRequest || code != CodeInvalid || field != c.field || !strings.Contains(msg, c.inMessage) {
				t.Errorf("%d %s %s %q, want 400 %s %s and %q", r.status, code, field, msg, CodeInvalid, c.field, c.inMessage)
			}
		})
	}
	if q, err := f.insp.GetQueueInfo("default"); err == nil && q.Size != 0 {
		t.Errorf("%d tasks in the queue, want none", q.Size)
	}
}
