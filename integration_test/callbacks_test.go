//go:build integration

package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
)

// callbackSecret signs the callbacks of the tests' configs.
const callbackSecret = "callback-SECRET-0a1b2c3d4e"

// callbackPost is one POST the callback receiver got.
type callbackPost struct {
	at       time.Time
	event    lifecycle.Event
	body     string
	verified error // lifecycle.Verify's answer
	answered bool  // it was answered 2xx; false: refused, or its sender hung up first
}

// callbackReceiver is a tenant's status callback endpoint: it records every
// POST, verifies its signature, and while held keeps each POST waiting
// until it is released or its sender hangs up (an endpoint that stalls).
type callbackReceiver struct {
	srv *httptest.Server

	mu      sync.Mutex
	posts   []callbackPost
	held    chan struct{} // closed on release; nil: not held
	arrived chan struct{} // a value per POST, never blocks
}

func newCallbackReceiver(t *testing.T) *callbackReceiver {
	r := &callbackReceiver{held: make(chan struct{}), arrived: make(chan struct{}, 1)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() { r.release(); r.srv.Close() })
	return r
}

func (r *callbackReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	p := callbackPost{at: time.Now(), body: string(body), verified: lifecycle.Verify(callbackSecret, req.Header.Get(lifecycle.SignatureHeader), body, time.Minute)}
	_ = json.Unmarshal(body, &p.event)
	r.mu.Lock()
	i, held := len(r.posts), r.held
	r.posts = append(r.posts, p)
	r.mu.Unlock()
	select {
	case r.arrived <- struct{}{}:
	default:
	}
	if held != nil {
		select {
		case <-held:
		case <-req.Context().Done():
		}
		if req.Context().Err() != nil {
			return // its sender hung up: not answered
		}
	}
	if p.verified != nil {
		http.Error(w, p.verified.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.posts[i].answered = true
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// release answers every POST from now on, and those waiting.
func (r *callbackReceiver) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held != nil {
		close(r.held)
		r.held = nil
	}
}

func (r *callbackReceiver) snapshot() []callbackPost {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]callbackPost(nil), r.posts...)
}

// TestKill9LosesNoCallback: a worker killed with kill -9 while its
// tenant's endpoint stalls, with POSTs in flight and events waiting, loses
// none of them: once the endpoint answers, another worker delivers every
// event every message's history holds (accepted from enqueue, booked and
// sent from the workers), each at least once, signed, and an event POSTed
// twice is the same event, with the same ID. The POSTs the killed worker
// had in flight are among those delivered afterwards.
func TestKill9LosesNoCallback(t *testing.T) {
	t.Parallel() // no bound a busy core breaks: it runs beside the chaos runs
	rec := newCallbackReceiver(t)
	f := newFleet(t, fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: 0, Jitter: 0,
		Policy: "[{limit: 1, per: 1h}]", Rate: 100, Burst: 20, Book: true,
		Events: fmt.Sprintf(`
  callbacks:
    "":
      url: %s/events
      secret: %s
      timeout: 5s
  callback_backoff: 500ms
  callback_max_backoff: 2s
`, rec.srv.URL, callbackSecret),
	}, nil)

	// Two notifications for each of 20 recipients through the enqueue
	// binary: each has its accepted event; the first of each recipient is
	// sent, the second books its moment an hour on.
	const recipients = 20
	var lines []string
	var ids []string
	for i := range recipients {
		for n := range 2 {
			key := fmt.Sprintf("cb-%d-%d", i, n)
			line, _ := json.Marshal(jsonlLine{Recipient: fmt.Sprintf("r%d@example.com", i), Template: "news", IdempotencyKey: key})
			lines, ids = append(lines, string(line)), append(ids, message.TaskID(key))
		}
	}
	f.writeConfig("enqueue", "")
	if _, stderr, code := runCommand(t, f.dir, strings.NewReader(strings.Join(lines, "\n")+"\n"), buildBinary(t, "enqueue"),
		"-config", "enqueue.yaml", "-file", "-"); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s", code, stderr)
	}
	w1 := f.startWorker("w1") // its first read of the stream takes a POST of each of its lanes

	// Every outcome decided (each recipient's first sent, its second
	// booked an hour on, or later), and the first POSTs stalled at the
	// endpoint: kill -9.
	ctx := context.Background()
	stream := fleetPrefix + "callbacks:{}"
	deadline := time.Now().Add(30 * time.Second)
	for {
		q := f.queueState()
		if q.Pending+q.Active == 0 && q.Completed+q.Retry == len(ids) && len(rec.snapshot()) >= lifecycle.DefaultParallel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: queue %+v, %d POSTs; want every notification sent or booked, and %d POSTs", q, len(rec.snapshot()), lifecycle.DefaultParallel)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := w1.cmd.Process.Kill(); err != nil { // SIGKILL, to our own child
		t.Fatal(err)
	}
	w1.wait(10 * time.Second)
	killed := time.Now()
	inFlight := map[string]bool{}
	for _, p := range rec.snapshot() {
		inFlight[p.event.ID] = true
	}
	rec.release()
	f.startWorker("w2")

	// Every event of every history, delivered.
	recorder := lifecycle.NewRecorder(f.rdb, lifecycle.Options{Prefix: fleetPrefix})
	want := map[string]lifecycle.Event{}
	for _, id := range ids {
		history, err := recorder.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var types []lifecycle.Type
		for _, e := range history {
			want[e.ID] = e
			types = append(types, e.Type)
		}
		if len(types) < 2 || types[0] != lifecycle.Accepted || !slices.Contains(types, lifecycle.Sent) && !slices.Contains(types, lifecycle.Booked) {
			t.Errorf("history of %s: %v, want accepted, then sent or booked", id, types)
		}
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		delivered := map[string]bool{}
		for _, p := range rec.snapshot() {
			if p.answered {
				delivered[p.event.ID] = true
			}
		}
		missing := 0
		for id := range want {
			if !delivered[id] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events never delivered after the kill", missing, len(want))
		}
		select {
		case <-rec.arrived:
		case <-time.After(200 * time.Millisecond):
		}
	}

	// Signed, and deduplicable: the POSTs of one ID carry one event, which
	// a history holds (w2 may have recorded more since: a booking it found
	// late, because w1 died before claiming it, is booked again).
	for _, id := range ids {
		history, err := recorder.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range history {
			if _, ok := want[e.ID]; !ok {
				want[e.ID] = e
			}
		}
	}
	seen := map[string]lifecycle.Event{}
	posts := rec.snapshot()
	for _, p := range posts {
		if p.verified != nil {
			t.Errorf("a POST of %s %s: %v", p.event.Type, p.event.ID, p.verified)
		}
		if first, ok := seen[p.event.ID]; ok && !reflect.DeepEqual(first, p.event) {
			t.Errorf("event %s POSTed as %+v and as %+v", p.event.ID, first, p.event)
		}
		seen[p.event.ID] = p.event
		if w, ok := want[p.event.ID]; !ok || w.Type != p.event.Type || w.Message != p.event.Message {
			t.Errorf("POSTed %+v, which no history holds", p.event)
		}
	}
	if len(inFlight) == 0 {
		t.Fatal("no POST was in flight at the kill: the test did not test that")
	}
	for id := range inFlight {
		if !slices.ContainsFunc(posts, func(p callbackPost) bool { return p.event.ID == id && p.answered && p.at.After(killed) }) {
			t.Errorf("event %s, in flight at the kill, was not delivered after it", id)
		}
	}
	t.Logf("%d events, %d POSTs: %d in flight at the kill, delivered after it", len(want), len(posts), len(inFlight))
	for deadline := time.Now().Add(10 * time.Second); f.rdb.XLen(ctx, stream).Val() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("%d events left in the stream 10s after every one was delivered", f.rdb.XLen(ctx, stream).Val())
			break
		}
	}
	for _, e := range want {
		if e.Type != lifecycle.Accepted && e.IdempotencyKey == "" {
			t.Errorf("%s event of %s without its message's idempotency key", e.Type, e.Message)
		}
	}
	for _, e := range seen {
		if e.IdempotencyKey == "" || !strings.HasPrefix(e.IdempotencyKey, "cb-") {
			t.Errorf("%s event of %s POSTed without its message's idempotency key", e.Type, e.Message)
		}
	}
}
