package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/throttle"
)

// logFixture is a fixture whose access log is kept.
func logFixture(t *testing.T) (*fixture, *bytes.Buffer) {
	t.Helper()
	f := newFixture(t)
	var log bytes.Buffer
	cfg := testConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	f.reg = prometheus.NewRegistry()
	s, err := New(Options{Config: cfg, Redis: f.rdb, Limiter: f.lim, Metrics: f.reg, Log: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = newServer(t, s)
	return f, &log
}

// newServer serves s on a loopback port until the test ends.
func newServer(t *testing.T, s *Server) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

// TestEveryAnswerLoggedAndCounted: the 404 of an unknown path, the 405 of
// a method a path does not have and the 404 of a path the mux would have
// redirected are logged and counted like a route's answers, under route
// "unrouted", each with its request ID.
func TestEveryAnswerLoggedAndCounted(t *testing.T) {
	f, log := logFixture(t)
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"PUT", "/v1/notifications", 405},
		{"GET", "/v2/notifications", 404},
		{"GET", "/v1//notifications", 404},
		{"GET", "/v1/notifications/", 404},
	} {
		r := f.do(c.method, c.path, billingKey, "", RequestIDHeader, "trace-"+c.method)
		if r.status != c.status {
			t.Errorf("%s %s = %d, want %d", c.method, c.path, r.status, c.status)
		}
	}
	if n := f.requests(t, "unrouted", "405"); n != 1 {
		t.Errorf("throttler_api_requests_total{route=unrouted,status=405} = %v, want 1", n)
	}
	if n := f.requests(t, "unrouted", "404"); n != 3 {
		t.Errorf("throttler_api_requests_total{route=unrouted,status=404} = %v, want 3", n)
	}
	for _, want := range []string{"route=unrouted status=405", "request_id=trace-PUT", "route=unrouted status=404", "request_id=trace-GET"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the access log has no %q:\n%s", want, log)
		}
	}
}

// TestRequestID: every answer carries a request ID, the request's own
// when well-formed (Request-Id or X-Request-Id), and the access log names it.
func TestRequestID(t *testing.T) {
	f, log := logFixture(t)
	for _, c := range []struct {
		name, header, id string
		kept             bool
	}{
		{"none", "", "", false},
		{"Request-Id", RequestIDHeader, "req_42.a:b-c", true},
		{"X-Request-Id", "X-Request-Id", "0f8fad5b-d9cb-469f-a165-70867728950e", true},
		{"malformed", RequestIDHeader, "a b\"c", false},
		{"too long", RequestIDHeader, strings.Repeat("x", 129), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h []string
			if c.header != "" {
				h = []string{c.header, c.id}
			}
			r := f.do(http.MethodGet, "/v1/notifications/nope", billingKey, "", h...)
			got := r.header.Get(RequestIDHeader)
			if c.kept != (got == c.id) || got == "" {
				t.Errorf("Request-Id %q, want the request's %q: %t", got, c.id, c.kept)
			}
			if !strings.Contains(log.String(), "request_id="+got) {
				t.Errorf("the access log does not name request %s:\n%s", got, log)
			}
		})
	}
}

// TestContentType: a POST's body must be sent as application/json: a form,
// text or no Content-Type is a 415 naming the header, before it is read.
func TestContentType(t *testing.T) {
	f := newFixture(t)
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", "", "application/jsonp"} {
		for _, path := range []string{"/v1/notifications", "/v1/notifications/batch"} {
			r := f.do(http.MethodPost, path, billingKey, welcome, "Content-Type", ct)
			if code, field := r.errorOf(t); r.status != http.StatusUnsupportedMediaType || code != CodeUnsupportedMedia || field != "Content-Type" {
				t.Errorf("POST %s as %q = %d %s %s, want 415 %s Content-Type", path, ct, r.status, code, field, CodeUnsupportedMedia)
			}
		}
	}
	if r := f.post(billingKey, welcome, "Content-Type", "application/json; charset=utf-8"); r.status != http.StatusAccepted {
		t.Errorf("application/json; charset=utf-8 = %d %v, want 202", r.status, r.body)
	}
}

// TestBodyAtTheLimit: a body of MaxBody bytes is read; one whose task
// would be over message.MaxPayloadLen with what the config adds is a 413
// naming /data, and one over MaxBody a 413 of the body.
func TestBodyAtTheLimit(t *testing.T) {
	f := newFixture(t)
	body := func(size int) string {
		head := `{"recipient":"a@example.com","template":"t","data":{"x":"`
		return head + strings.Repeat("x", size-len(head)-3) + `"}}`
	}
	for _, size := range []int{MaxBody - 88, MaxBody} {
		r := f.post(billingKey, body(size))
		code, field := r.errorOf(t)
		msg := r.body["error"].(map[string]any)["message"].(string)
		if r.status != http.StatusRequestEntityTooLarge || code != CodeTooLarge || field != "/data" || !strings.Contains(msg, "more than 65536") {
			t.Errorf("a body of %d bytes = %d %s %q %q, want 413 %s /data", size, r.status, code, field, msg, CodeTooLarge)
		}
	}
	r := f.post(billingKey, body(MaxBody+1))
	if code, field := r.errorOf(t); r.status != http.StatusRequestEntityTooLarge || code != CodeTooLarge || field != "" {
		t.Errorf("a body of %d bytes = %d %s %q, want 413 %s", MaxBody+1, r.status, code, field, CodeTooLarge)
	}
	if r := f.post(billingKey, body(MaxBody-400)); r.status != http.StatusAccepted {
		t.Errorf("a body that fits = %d %v, want 202", r.status, r.body)
	}
}

// TestReplayedAndRateLimitHeaders: a replay says so; every answer to a
// known key says what its bucket holds.
func TestReplayedAndRateLimitHeaders(t *testing.T) {
	f := newFixture(t)
	first := f.post(slowKey, welcome, IdempotencyHeader, "k")
	if first.header.Get(ReplayedHeader) != "" || first.header.Get("RateLimit-Limit") != "2" || first.header.Get("RateLimit-Remaining") != "1" ||
		first.header.Get("RateLimit-Reset") != "2" {
		t.Errorf("first: %d %v, want 202, no %s, RateLimit 2, 1 left, full in 2s", first.status, first.header, ReplayedHeader)
	}
	again := f.post(slowKey, welcome, IdempotencyHeader, "k")
	if again.status != http.StatusOK || again.header.Get(ReplayedHeader) != "true" || again.header.Get("RateLimit-Remaining") != "0" {
		t.Errorf("again: %d %v, want 200, %s: true, none left", again.status, again.header, ReplayedHeader)
	}
	over := f.post(slowKey, welcome, IdempotencyHeader, "k")
	if over.status != http.StatusTooManyRequests || over.header.Get("RateLimit-Remaining") != "0" || over.header.Get("RateLimit-Reset") != "4" {
		t.Errorf("over: %d %v, want 429, none left, full in 4s", over.status, over.header)
	}
}

// TestRedisDownAnswers503WithRetryAfter: with Redis refusing connections,
// or accepting and never answering, a request is a 503 with Retry-After,
// within the route's Timeout rather than the Redis client's timeouts.
func TestRedisDownAnswers503WithRetryAfter(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused.Close()
	for name, addr := range map[string]string{"refused": refused.Addr().String(), "hung": hung.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
			// Not closed: Close waits out the abandoned commands' own
			// timeouts and retries (30 s), which is what the API's bound
			// spares the producer.
			t.Cleanup(func() { // Redis dies: the abandoned reads end
				mu.Lock()
				defer mu.Unlock()
				for _, c := range conns {
					c.Close()
				}
			})
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
			srv := newServer(t, s)
			// A deadline, not a speed target: without the API's own bound
			// a hung Redis holds the answer for the client's 40 s.
			client := &http.Client{Timeout: 20 * time.Second}
			for method, path := range map[string]string{http.MethodPost: "/v1/notifications", http.MethodGet: "/v1/notifications/x"} {
				req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(welcome))
				req.Header.Set("Authorization", "Bearer "+billingKey)
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				var e errorBody
				if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "1" ||
					json.Unmarshal(body, &e) != nil || e.Error.Code != CodeUnavailable {
					t.Errorf("%s: %d Retry-After %q %s, want 503 %s and Retry-After 1", method, res.StatusCode, res.Header.Get("Retry-After"), body, CodeUnavailable)
				}
				checkHeaders(t, method, res, true)
			}
		})
	}
}
