package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

const testSecret = "whsec-test-0123456789"

// receipt is one POST a receiver got.
type receipt struct {
	at     time.Time
	event  Event
	header string // the event ID header
	err    error  // what Verify said of its signature
	status int    // what the receiver answered
}

// receiver is a loopback endpoint that records every POST, verifies its
// signature and answers what answer says (204 when nil).
type receiver struct {
	srv    *httptest.Server
	answer func(seq int) int

	mu   sync.Mutex
	got  []receipt
	hang chan struct{} // while open, every POST waits (an endpoint that does not answer)
}

func newReceiver(t *testing.T, answer func(seq int) int) *receiver {
	t.Helper()
	r := &receiver{answer: answer}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.release()
		r.srv.Close()
	})
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	rc := receipt{at: time.Now(), header: req.Header.Get(EventIDHeader),
		err: Verify(testSecret, req.Header.Get(SignatureHeader), body, time.Minute)}
	_ = json.Unmarshal(body, &rc.event)
	r.mu.Lock()
	seq, hang := len(r.got), r.hang
	r.got = append(r.got, rc)
	rc.status = http.StatusNoContent
	if r.answer != nil {
		rc.status = r.answer(seq)
	}
	r.got[seq].status = rc.status
	r.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-req.Context().Done():
		}
	}
	w.WriteHeader(rc.status)
}

// hold makes every POST from now on wait until release.
func (r *receiver) hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hang = make(chan struct{})
}

func (r *receiver) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hang != nil {
		close(r.hang)
		r.hang = nil
	}
}

func (r *receiver) receipts() []receipt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receipt(nil), r.got...)
}

// delivered returns the IDs of the events answered 2xx, and how often.
func (r *receiver) delivered() map[string]int {
	got := map[string]int{}
	for _, rc := range r.receipts() {
		if rc.status/100 == 2 {
			got[rc.event.ID]++
		}
	}
	return got
}

// await polls until cond holds, failing the test after within.
func await(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
	}
}

// quick are the options of the tests' dispatchers: a fast schedule.
func quick(callbacks map[string]Endpoint) Options {
	return Options{Callbacks: callbacks, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second,
		LeaseMargin: 50 * time.Millisecond, Poll: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil)}
}

// dispatch runs a dispatcher on rdb until the test ends.
func dispatch(t *testing.T, rdb *redis.Client, o Options) *Dispatcher {
	t.Helper()
	d := NewDispatcher(rdb, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// TestCallbackRetriedWithBackoff: an endpoint that fails three times gets
// the event again after each failure, no sooner than its backoff (and the
// POST's lease), until it answers 2xx; every POST is signed, and the event
// then leaves the stream.
func TestCallbackRetriedWithBackoff(t *testing.T) {
	ctx := context.Background()
	rec := newReceiver(t, func(seq int) int {
		if seq < 3 {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	ep := Endpoint{URL: rec.srv.URL, Secret: testSecret, Timeout: 100 * time.Millisecond}
	o := quick(map[string]Endpoint{"billing": ep})
	o.Backoff = 200 * time.Millisecond // the lease is 150 ms: the waits are the backoff's, 200, 400, 800 ms
	r, rdb := newRecorder(t, o)
	if err := r.Record(ctx, Event{Type: Sent, Message: "m1", Tenant: "billing", Provider: "sms"}); err != nil {
		t.Fatal(err)
	}
	d := dispatch(t, rdb, o)
	await(t, 20*time.Second, "the event was not delivered", func() bool { return len(rec.delivered()) == 1 })
	got := rec.receipts()
	if len(got) != 4 {
		t.Fatalf("%d POSTs, want 3 failed and 1 delivered", len(got))
	}
	backoffs := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	for i, rc := range got {
		if rc.err != nil || rc.header != rc.event.ID || rc.event.Type != Sent || rc.event.Message != "m1" {
			t.Errorf("POST %d: signature %v, header %q, event %+v: want a signed sent event of m1", i, rc.err, rc.header, rc.event)
		}
		if i == 0 {
			continue
		}
		// The wait after try i counts from when try i was read, just
		// before it was POSTed.
		if gap := rc.at.Sub(got[i-1].at); gap < backoffs[i-1]-20*time.Millisecond {
			t.Errorf("try %d came %v after try %d, before its backoff %v", i+1, gap, i, backoffs[i-1])
		}
	}
	stream := streamKey(r.o.Prefix, "billing")
	await(t, 5*time.Second, "the delivered event is still in the stream", func() bool { return rdb.XLen(ctx, stream).Val() == 0 })
	if p := rdb.XPending(ctx, stream, Group).Val(); p.Count != 0 {
		t.Errorf("%d events pending after delivery", p.Count)
	}
	m := d.o.Metrics.Callbacks
	if f, ok := testutil.ToFloat64(m.WithLabelValues("billing", "failed")), testutil.ToFloat64(m.WithLabelValues("billing", "delivered")); f != 3 || ok != 1 {
		t.Errorf("callbacks counted failed %v, delivered %v; want 3 and 1", f, ok)
	}
}

// TestDeadEndpointHoldsNoOtherTenant: while one tenant's endpoint takes
// every POST and never answers, another tenant's events are all delivered,
// and the dead one's wait in its stream.
func TestDeadEndpointHoldsNoOtherTenant(t *testing.T) {
	ctx := context.Background()
	dead, live := newReceiver(t, nil), newReceiver(t, nil)
	dead.hold()
	o := quick(map[string]Endpoint{
		"dead": {URL: dead.srv.URL, Secret: testSecret, Timeout: time.Minute},
		"live": {URL: live.srv.URL, Secret: testSecret, Timeout: time.Minute},
	})
	r, rdb := newRecorder(t, o)
	dispatch(t, rdb, o)
	const n = 50
	for i := range n {
		msg := fmt.Sprintf("m%d", i)
		if err := r.Record(ctx, Event{Type: Sent, Message: msg, Tenant: "dead"}, Event{Type: Sent, Message: msg, Tenant: "live"}); err != nil {
			t.Fatal(err)
		}
	}
	await(t, 20*time.Second, "the live tenant's events were not all delivered", func() bool { return len(live.delivered()) == n })
	if got := rdb.XLen(ctx, streamKey(r.o.Prefix, "dead")).Val(); got != n {
		t.Errorf("the dead endpoint's stream holds %d events, want all %d", got, n)
	}
}

// TestEventsOfAKilledWorkerAreDelivered: events a worker read and never
// acknowledged (it was killed mid-POST) are taken over and delivered by
// another once their POST's lease is over, with the idempotency key of
// their message's accepted event.
func TestEventsOfAKilledWorkerAreDelivered(t *testing.T) {
	ctx := context.Background()
	rec := newReceiver(t, nil)
	o := quick(map[string]Endpoint{"billing": {URL: rec.srv.URL, Secret: testSecret, Timeout: 300 * time.Millisecond}})
	r, rdb := newRecorder(t, o)
	stream := streamKey(r.o.Prefix, "billing")
	if err := rdb.XGroupCreateMkStream(ctx, stream, Group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(ctx, Event{Type: Accepted, Message: "m1", Tenant: "billing", Via: ViaAPI, IdempotencyKey: "welcome-1"},
		Event{Type: Sent, Message: "m1", Tenant: "billing", Provider: "sms"}); err != nil {
		t.Fatal(err)
	}
	// The killed worker's read: the events are pending, its own.
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: "killed", Streams: []string{stream, ">"}, Count: 10, Block: -1}).Result()
	if err != nil || len(read[0].Messages) != 2 {
		t.Fatalf("the killed worker's read: %v, %v", read, err)
	}
	readAt := time.Now()
	dispatch(t, rdb, o)
	await(t, 20*time.Second, "the killed worker's events were not delivered", func() bool { return len(rec.delivered()) == 2 })
	for _, rc := range rec.receipts() {
		if rc.at.Sub(readAt) < 300*time.Millisecond {
			t.Errorf("%s POSTed %v after the killed worker read it, within its lease", rc.event.Type, rc.at.Sub(readAt))
		}
		if rc.event.IdempotencyKey != "welcome-1" {
			t.Errorf("%s POSTed with key %q, want the accepted event's", rc.event.Type, rc.event.IdempotencyKey)
		}
	}
}

// TestOldEventsAreGivenUp: an event older than GiveUp is dropped from its
// stream without a POST, and counted.
func TestOldEventsAreGivenUp(t *testing.T) {
	ctx := context.Background()
	rec := newReceiver(t, nil)
	o := quick(map[string]Endpoint{"billing": {URL: rec.srv.URL, Secret: testSecret}})
	o.GiveUp = time.Hour
	r, rdb := newRecorder(t, o)
	stream := streamKey(r.o.Prefix, "billing")
	old, _ := json.Marshal(Event{ID: "0123456789abcdef0123456789abcdef", Type: Sent, Message: "old", Tenant: "billing"})
	twoHoursAgo := time.Now().Add(-2 * time.Hour).UnixMilli()
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: strconv.FormatInt(twoHoursAgo, 10) + "-0", Values: []any{"e", old}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(ctx, Event{Type: Sent, Message: "new", Tenant: "billing"}); err != nil {
		t.Fatal(err)
	}
	d := dispatch(t, rdb, o)
	await(t, 10*time.Second, "the stream was not emptied", func() bool { return rdb.XLen(ctx, stream).Val() == 0 })
	if got := rec.receipts(); len(got) != 1 || got[0].event.Message != "new" {
		t.Errorf("POSTed %v, want the new event alone", got)
	}
	if n := testutil.ToFloat64(d.o.Metrics.Callbacks.WithLabelValues("billing", "given_up")); n != 1 {
		t.Errorf("given up %v, want 1", n)
	}
}

// TestPoisonEventHoldsBackNoOther: an endpoint that refuses one event for
// good (and that event alone, sent first, made it look down) gets the
// others all the same, while the refused one is retried with backoff.
func TestPoisonEventHoldsBackNoOther(t *testing.T) {
	ctx := context.Background()
	var rec *receiver
	rec = newReceiver(t, func(seq int) int {
		if rec.got[seq].event.Message == "poison" { // called under rec.mu
			return http.StatusUnprocessableEntity
		}
		return http.StatusNoContent
	})
	o := quick(map[string]Endpoint{"billing": {URL: rec.srv.URL, Secret: testSecret, Timeout: 100 * time.Millisecond}})
	r, rdb := newRecorder(t, o)
	if err := r.Record(ctx, Event{Type: Sent, Message: "poison", Tenant: "billing"}); err != nil {
		t.Fatal(err)
	}
	dispatch(t, rdb, o)
	await(t, 10*time.Second, "the poison event was not tried", func() bool { return len(rec.receipts()) > 0 })
	for i := range 20 {
		if err := r.Record(ctx, Event{Type: Sent, Message: fmt.Sprintf("m%d", i), Tenant: "billing"}); err != nil {
			t.Fatal(err)
		}
	}
	await(t, 20*time.Second, "the events after the poison one were not all delivered", func() bool { return len(rec.delivered()) == 20 })
	await(t, 10*time.Second, "the poison event was not retried", func() bool {
		tries := 0
		for _, rc := range rec.receipts() {
			if rc.event.Message == "poison" {
				tries++
			}
		}
		return tries >= 2
	})
}
