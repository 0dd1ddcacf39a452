package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/screen"
	"github.com/notify-throttle/throttler/throttle"
)

// eventsWorker is a worker whose throttle records events: policy "mkt" (1
// per hour), provider "gw" (1000/s), a Screen and sent markers.
type eventsWorker struct {
	rdb    *redis.Client
	client *asynq.Client
	insp   *asynq.Inspector
	th     *Throttle
	rec    *lifecycle.Recorder
	srv    *asynq.Server
}

// eventsConfig is what differs between the eventsWorkers of the tests.
type eventsConfig struct {
	book     bool
	settings PolicySettings                  // of policy mkt
	options  lifecycle.Options               // of the recorder
	answer   func(m providers.Message) error // what gw answers; nil: it accepts
	rdb      *redis.Client                   // nil: a database of its own
	noEvents bool                            // the throttle records none
}

func newEventsWorker(t *testing.T, c eventsConfig) *eventsWorker {
	t.Helper()
	rdb := c.rdb
	if rdb == nil {
		rdb = shared.ClientOn(t, shared.DB(t))
	}
	answer := c.answer
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	provider := newScopedFake(func(m providers.Message) error {
		if answer == nil {
			return nil
		}
		return answer(m)
	})
	w := &eventsWorker{rdb: rdb, client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb),
		rec: lifecycle.NewRecorder(rdb, c.options)}
	w.th = &Throttle{
		Limiter: lim,
		Rules:   Rules{Policies: map[string]*throttle.Quota{"mkt": q}, Settings: map[string]PolicySettings{"mkt": c.settings}, Providers: map[string]Route{"gw": {Bucket: b, Provider: provider}}},
		Sent:    NewSentMarks(lim),
		Screen:  screen.New(rdb, ""),
		Events:  w.rec,
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pacing:  Pacing{Book: c.book},
	}
	if c.noEvents {
		w.th.Events = nil
	}
	w.srv = startWorker(t, rdb, w.th, asynq.Config{Concurrency: 8, TaskCheckInterval: 50 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond, LogLevel: asynq.ErrorLevel})
	t.Cleanup(w.srv.Shutdown)
	return w
}

// enqueue enqueues a notification of tenant billing to recipient, with
// task ID id, kept an hour once done.
func (w *eventsWorker) enqueue(t *testing.T, id, recipient string, opts ...asynq.Option) {
	t.Helper()
	task, err := message.NewTask(message.Notification{Recipient: recipient, Policy: "mkt", Provider: "gw", Template: "t", Tenant: "billing"}, id,
		append([]asynq.Option{asynq.Retention(time.Hour)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
}

// history waits until message id's history holds n events and returns it.
func (w *eventsWorker) history(t *testing.T, id string, n int) []lifecycle.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := w.rec.History(context.Background(), id)
		if err == nil && len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("history of %s: %+v, %v; want %d events", id, got, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEventsOfEachOutcome: every outcome the worker decides is its
// message's event, with its tenant, its type's fields and a time by
// Redis's clock.
func TestEventsOfEachOutcome(t *testing.T) {
	t.Parallel()
	providerSays := func(m providers.Message) error {
		switch m.Recipient {
		case "rejected":
			return sendErrorf(providers.Reject, 0, "400 Bad Request: no such number")
		case "dead":
			return &providers.SendError{Outcome: providers.Dead, Err: errString("404 UNREGISTERED")}
		case "paused":
			return sendErrorf(providers.Pause, 30*time.Second, "429 Too Many Requests")
		case "failing":
			return errors.New("503 Service Unavailable")
		}
		return nil
	}
	past := time.Now().Add(-time.Minute)
	for _, tt := range []struct {
		name     string
		book     bool
		settings PolicySettings
		before   []string // recipients sent to first, by tasks of their own
		to       string
		opts     []asynq.Option
		sendBy   *time.Time
		check    func(t *testing.T, e lifecycle.Event)
	}{
		{name: "sent", to: "alice", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Sent, e.Provider == "gw")
		}},
		{name: "booked", book: true, before: []string{"bob"}, to: "bob", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Booked, e.Moment != nil && e.Moment.Sub(e.At) > 59*time.Minute && e.Rule == "policy mkt (1 per 1h)")
		}},
		{name: "deferred by a rule", before: []string{"carol"}, to: "carol", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Deferred, e.Until != nil && e.Until.Sub(e.At) > 59*time.Minute && e.Rule == "policy mkt (1 per 1h)" && e.Provider == "")
		}},
		{name: "dropped", settings: PolicySettings{Drop: true}, before: []string{"dave"}, to: "dave", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Dropped, e.Rule == "policy mkt (1 per 1h)")
		}},
		{name: "expired", to: "erin", sendBy: &past, check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Expired, strings.HasPrefix(e.Reason, "send-by "))
		}},
		{name: "rejected", to: "rejected", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Archived, e.Reason == lifecycle.ArchivedRejected && e.Provider == "gw" && strings.Contains(e.Detail, "no such number"))
		}},
		{name: "dead address", to: "dead", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Archived, e.Reason == lifecycle.ArchivedDead && e.Detail == "dead address: 404 UNREGISTERED")
		}},
		{name: "suppressed", before: []string{"dead"}, to: "dead", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Archived, e.Reason == lifecycle.ArchivedSuppressed && strings.HasPrefix(e.Detail, "suppressed by provider gw"))
		}},
		{name: "paused by its provider", to: "paused", check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Deferred, e.Provider == "gw" && e.Until != nil && e.Until.Sub(e.At) > 29*time.Second &&
				strings.HasPrefix(e.Detail, "provider gw paused: 429"))
		}},
		{name: "out of retries", to: "failing", opts: []asynq.Option{asynq.MaxRetry(0)}, check: func(t *testing.T, e lifecycle.Event) {
			want(t, e, lifecycle.Archived, e.Reason == lifecycle.ArchivedExhausted && e.Detail == "503 Service Unavailable")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newEventsWorker(t, eventsConfig{book: tt.book, settings: tt.settings, answer: providerSays})
			for i, r := range tt.before {
				id := "before-" + string(rune('0'+i))
				w.enqueue(t, id, r)
				w.history(t, id, 1)
			}
			task, err := message.NewTask(message.Notification{Recipient: tt.to, Policy: "mkt", Provider: "gw", Template: "t", Tenant: "billing", SendBy: tt.sendBy}, "m",
				tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.client.Enqueue(task); err != nil {
				t.Fatal(err)
			}
			before := w.rdb.Time(context.Background()).Val()
			got := w.history(t, "m", 1)
			e := got[0]
			if len(got) != 1 || e.Message != "m" || e.Tenant != "billing" || len(e.ID) != 32 {
				t.Errorf("history %+v, want one event of m, tenant billing", got)
			}
			if e.At.Before(before.Add(-time.Second)) || e.At.After(time.Now().Add(time.Second)) {
				t.Errorf("event at %v, Redis's clock was %v at the enqueue", e.At, before)
			}
			tt.check(t, e)
		})
	}
}

// want fails the test unless e is of type ty and ok.
func want(t *testing.T, e lifecycle.Event, ty lifecycle.Type, ok bool) {
	t.Helper()
	if e.Type != ty || !ok {
		t.Errorf("event %+v, want %s with its fields", e, ty)
	}
}

// TestMalformedIsArchivedWithItsTenant: a notification the worker cannot
// route is archived, its event with the tenant its payload names.
func TestMalformedIsArchivedWithItsTenant(t *testing.T) {
	t.Parallel()
	w := newEventsWorker(t, eventsConfig{})
	task, err := message.NewTask(message.Notification{Recipient: "a", Policy: "nope", Provider: "gw", Template: "t", Tenant: "billing"}, "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
	e := w.history(t, "m", 1)[0]
	want(t, e, lifecycle.Archived, e.Reason == lifecycle.ArchivedMalformed && e.Tenant == "billing" &&
		strings.HasPrefix(e.Detail, `malformed notification: policy "nope" is not defined`))
}

// TestSentRecordedAgainAfterARedelivery: a task whose first run sent its
// message but did not record the event (its worker died just after the
// send) records it when it runs again and finds itself sent, with the same
// ID as a first run's.
func TestSentRecordedAgainAfterARedelivery(t *testing.T) {
	t.Parallel()
	first := newEventsWorker(t, eventsConfig{noEvents: true}) // its run dies before it records: none recorded
	first.enqueue(t, "m", "alice")
	w := first
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err := w.insp.GetTaskInfo("default", "m"); err == nil && info.State == asynq.TaskStateCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("m was not sent")
		}
	}
	if got, _ := w.rec.History(context.Background(), "m"); len(got) != 0 {
		t.Fatalf("history %+v before the redelivery, want none", got)
	}
	first.srv.Shutdown()
	if err := w.insp.DeleteTask("default", "m"); err != nil {
		t.Fatal(err)
	}
	w = newEventsWorker(t, eventsConfig{rdb: first.rdb})
	w.enqueue(t, "m", "alice") // the task again, to a worker that records
	got := w.history(t, "m", 1)
	e := lifecycle.Event{Type: lifecycle.Sent, Message: "m"}
	if got[0].Type != lifecycle.Sent || got[0].ID != lifecycle.NewID("m", lifecycle.Sent, "") || got[0].Provider != "gw" {
		t.Errorf("history %+v, want the sent event, ID %s", got, lifecycle.NewID(e.Message, e.Type, ""))
	}
}

// TestDeadCallbackEndpointDelaysNoSend: with a tenant's callback endpoint
// taking every POST and never answering, every message is sent and every
// task's run ends, while their events wait in the tenant's stream.
func TestDeadCallbackEndpointDelaysNoSend(t *testing.T) {
	t.Parallel()
	hung := make(chan struct{})
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hung); dead.Close() })
	o := lifecycle.Options{Callbacks: map[string]lifecycle.Endpoint{"billing": {URL: dead.URL, Secret: "whsec-0123456789abcdef", Timeout: time.Hour}},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w := newEventsWorker(t, eventsConfig{options: o})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); lifecycle.NewDispatcher(w.rdb, o).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const n = 40
	var ids []string
	for i := range n {
		id := "m" + strings.Repeat("x", i)
		ids = append(ids, id)
		w.enqueue(t, id, "r"+strings.Repeat("x", i))
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		q, err := w.insp.GetQueueInfo("default")
		if err == nil && q.Completed == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the callback endpoint dead, the queue is %+v after 20s, want all %d sent and completed", q, n)
		}
	}
	stream := "throttle:callbacks:{billing}"
	if got := w.rdb.XLen(context.Background(), stream).Val(); got != n {
		t.Errorf("the tenant's stream holds %d events, want all %d sent events", got, n)
	}
	for _, id := range ids {
		if got, _ := w.rec.History(context.Background(), id); !slices.ContainsFunc(got, func(e lifecycle.Event) bool { return e.Type == lifecycle.Sent }) {
			t.Errorf("history of %s: %+v, want its sent event", id, got)
		}
	}
}
