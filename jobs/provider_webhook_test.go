package jobs

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
			p := NewWebhookProvider("sms", srv.URL, 100*time.Millisecond, nil)
			m := Message{ID: "task-1", Recipient: "alice", Template: "welcome", Data: json.RawMessage(`{"a":1}`)}
			err := p.Send(context.Background(), m)
			if tc.ok {
				if err != nil {
					t.Fatalf("Send: %v", err)
				}
				if key != "task-1" || got.Recipient != "alice" || string(got.Data) != `{"a":1}` {
					t.Errorf("server saw key %q, message %+v", key, got)
				}
				return
			}
			o, after := outcome(err)
			if err == nil || o != tc.outcome || after != tc.after {
				t.Errorf("Send: %v -> outcome %d after %s; want outcome %d after %s", err, o, after, tc.outcome, tc.after)
			}
		})
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	if got := retryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now); got != 90*time.Second {
		t.Errorf("retryAfter(date) = %s, want 1m30s", got)
	}
}
