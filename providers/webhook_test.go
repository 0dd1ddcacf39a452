package providers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWebhookOutcomes(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		header  map[string]string
		sleep   time.Duration
		outcome Outcome
		after   time.Duration
		ok      bool
	}{
		{name: "accepted", status: 202, ok: true},
		{name: "429 with seconds", status: 429, header: map[string]string{"Retry-After": "7"}, outcome: Pause, after: 7 * time.Second},
		{name: "429 without Retry-After", status: 429, outcome: Pause, after: time.Second},
		{name: "503", status: 503, outcome: Retry},
		{name: "timeout", status: 200, sleep: 300 * time.Millisecond, outcome: Retry},
		{name: "400", status: 400, outcome: Reject},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got Message
			var key string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key = r.Header.Get("Idempotency-Key")
				_ = json.NewDecoder(r.Body).Decode(&got)
				time.Sleep(tc.sleep)
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte("reason text"))
			}))
			defer srv.Close()
			p := NewWebhook("sms", srv.URL, 100*time.Millisecond, nil, nil)
			m := Message{ID: "task-1", Recipient: "alice", Template: "welcome", Data: json.RawMessage(`{"a":1}`)}
			_, err := p.Send(context.Background(), m)
			if tc.ok {
				if err != nil {
					t.Fatalf("Send: %v", err)
				}
				if key != "task-1" || got.Recipient != "alice" || string(got.Data) != `{"a":1}` {
					t.Errorf("server saw key %q, message %+v", key, got)
				}
				return
			}
			o, after := Retry, time.Duration(0)
			if se, ok := err.(*SendError); ok {
				o, after = se.Outcome, se.RetryAfter
			}
			if err == nil || o != tc.outcome || after != tc.after {
				t.Errorf("Send: %v -> outcome %d after %s; want outcome %d after %s", err, o, after, tc.outcome, tc.after)
			}
		})
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	if got := webhookWait(now.Add(90*time.Second).Format(http.TimeFormat), now); got != 90*time.Second {
		t.Errorf("webhookWait(date) = %s, want 1m30s", got)
	}
}

// TestWebhookKeepsConnections: a provider that had many sends in flight
// keeps their connections for the next ones rather than dialing anew.
// net/http's default transport keeps only 2 idle connections per host, so
// a second wave of 16 concurrent sends dialed 14 new connections.
func TestWebhookKeepsConnections(t *testing.T) {
	const senders = 16
	var (
		mu      sync.Mutex
		dialed  int
		waiting int
		release chan struct{}
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Hold every request until all senders are in: each needs a
		// connection of its own at once.
		mu.Lock()
		waiting++
		if waiting == senders {
			close(release)
		}
		wait := release
		mu.Unlock()
		select {
		case <-wait:
		case <-r.Context().Done():
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			dialed++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	p := NewWebhook("hook", srv.URL, time.Minute, nil, nil)
	wave := func(n int) {
		t.Helper()
		mu.Lock()
		waiting, release = 0, make(chan struct{})
		mu.Unlock()
		var wg sync.WaitGroup
		errs := make(chan error, senders)
		for g := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := p.Send(context.Background(), Message{ID: fmt.Sprintf("m-%d-%d", n, g), Recipient: "r", Template: "t"})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if dialed != senders {
			t.Fatalf("after wave %d of %d concurrent sends: %d connections dialed, want %d", n, senders, dialed, senders)
		}
	}
	wave(1)
	// No wait needed: net/http puts a connection back in its idle pool
	// before a read of the body returns EOF (or, with no body, before Do
	// returns), and Send reads the body to its end.
	wave(2)
}

// TestWebhookReportsTheAnswersID: a 2xx answer's X-Message-Id or Id
// header, else its JSON body's id, is the provider's ID for the message.
func TestWebhookReportsTheAnswersID(t *testing.T) {
	tests := []struct {
		name   string
		header map[string]string
		body   string
		want   string
	}{
		{name: "X-Message-Id", header: map[string]string{"X-Message-Id": "msg-1", "Id": "other"}, body: `{"id":"other"}`, want: "msg-1"},
		{name: "Id", header: map[string]string{"Id": "msg-2"}, want: "msg-2"},
		{name: "JSON string", body: `{"id":"msg-3","status":"queued"}`, want: "msg-3"},
		{name: "JSON number", body: `{"id":12345}`, want: "12345"},
		{name: "none", body: `accepted`, want: ""},
		{name: "too long", header: map[string]string{"X-Message-Id": strings.Repeat("x", 257)}, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(http.StatusAccepted)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			id, err := NewWebhook("hook", srv.URL, time.Second, nil, nil).Send(context.Background(), Message{ID: "task-1", Recipient: "alice"})
			if err != nil || id != tc.want {
				t.Errorf("Send = %q, %v; want %q", id, err, tc.want)
			}
		})
	}
}

// TestWebhookRedactsTheRecipient: an answer that names the recipient
// (echoing the request) fails with an error that shows it redacted, its
// status kept.
func TestWebhookRedactsTheRecipient(t *testing.T) {
	for _, status := range []int{400, 503} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var m Message
			_ = json.NewDecoder(r.Body).Decode(&m)
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":"no such user %s"}`, m.Recipient)
		}))
		_, err := NewWebhook("hook", srv.URL, time.Second, nil, nil).Send(context.Background(), Message{ID: "task-1", Recipient: "alice@example.com"})
		srv.Close()
		want := fmt.Sprintf(`webhook hook: %d %s: {"error":"no such user a***@example.com"}`, status, http.StatusText(status))
		if err == nil || err.Error() != want {
			t.Errorf("%d: %v, want %s", status, err, want)
		}
	}
}
