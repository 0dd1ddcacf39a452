package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// Keys of the tests' config.
const (
	billingKey = "billing-0123456789abcdef"
	growthKey  = "growth-0123456789abcdef"
	slowKey    = "slow-0123456789abcdef"
)

// fixture is an API server on a database of its own, and an HTTP client.
type fixture struct {
	t    testing.TB
	rdb  *redis.Client
	srv  *httptest.Server
	insp *asynq.Inspector
	reg  *prometheus.Registry
	lim  *throttle.Limiter
}

func testConfig() *config.Config {
	cfg := config.Default()
	cfg.Worker.Queues = map[string]int{"default": 1, "critical": 2}
	cfg.Policies["marketing"] = config.Policy{Windows: []throttle.Window{{Limit: 1, Per: time.Hour}}, OverCap: config.OverCapDefer}
	cfg.Policies["transactional"] = config.Policy{Windows: []throttle.Window{{Limit: 20, Per: time.Hour}}, OverCap: config.OverCapDefer}
	cfg.Providers["console"] = config.Provider{Type: config.ProviderLog, Rate: 10, Burst: 10, Output: os.DevNull}
	cfg.Providers["sms"] = config.Provider{Type: config.ProviderLog, Rate: 10, Burst: 10, Output: os.DevNull}
	cfg.Defaults = config.Defaults{Policy: "marketing", Provider: "console", Queue: "default"}
	cfg.API.Keys = map[string]config.APIKey{
		"billing": {Key: billingKey, Tenant: "billing", Rate: 1000, Burst: 200},
		"growth":  {Key: growthKey, Tenant: "growth", Policies: []string{"marketing"}, Providers: []string{"console"}, Rate: 1000, Burst: 200},
		"slow":    {Key: slowKey, Tenant: "slow", Rate: 0.5, Burst: 2},
	}
	return cfg
}

// newFixture serves the tests' config, changed by each of change.
func newFixture(t testing.TB, change ...func(*config.Config)) *fixture {
	t.Helper()
	rdb, _ := shared.NewClient(t)
	cfg := testConfig()
	for _, c := range change {
		c(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	lim, err := throttle.New(rdb, throttle.Options{Prefix: cfg.Redis.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(Options{Config: cfg, Redis: rdb, Limiter: lim, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &fixture{t: t, rdb: rdb, srv: srv, insp: asynq.NewInspectorFromRedisClient(rdb), reg: reg, lim: lim}
}

// response is an API response, its body decoded.
type response struct {
	status int
	header http.Header
	body   map[string]any
}

// errorOf returns the response's error object, failing the test unless
// the body is exactly {"error": {"code", "message"[, "field"]}}.
func (r response) errorOf(t *testing.T) (code, field string) {
	t.Helper()
	e, ok := r.body["error"].(map[string]any)
	if !ok || len(r.body) != 1 {
		t.Fatalf("status %d: body %v, want {\"error\": {...}}", r.status, r.body)
	}
	for k := range e {
		if !slices.Contains([]string{"code", "message", "field"}, k) {
			t.Errorf("error member %q: only code, message, field", k)
		}
	}
	if e["code"] == "" || e["message"] == "" {
		t.Errorf("error %v: code and message must be set", e)
	}
	f, _ := e["field"].(string)
	return e["code"].(string), f
}

// do sends a request with key (none if "") and headers as name, value pairs.
func (f *fixture) do(method, path, key, body string, headers ...string) response {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	out := response{status: res.StatusCode, header: res.Header}
	if err := json.Unmarshal(data, &out.body); err != nil {
		f.t.Fatalf("%s %s: status %d, body %q is not a JSON object: %v", method, path, res.StatusCode, data, err)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		f.t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	routed := checkListed(f.t, method, path, res.StatusCode)
	checkHeaders(f.t, method+" "+path, res, routed && key != "")
	return out
}

// checkHeaders fails the test unless an answer carries a request ID, and
// the RateLimit headers if it answered a known key (not a 401; a 503 only
// when Redis answered).
func checkHeaders(t testing.TB, what string, res *http.Response, keyed bool) {
	t.Helper()
	if !wellFormedID.MatchString(res.Header.Get(RequestIDHeader)) {
		t.Errorf("%s: %d without a %s", what, res.StatusCode, RequestIDHeader)
	}
	if !keyed || res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusServiceUnavailable {
		return
	}
	for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
		if _, err := strconv.Atoi(res.Header.Get(h)); err != nil {
			t.Errorf("%s: %d with %s %q, want a number", what, res.StatusCode, h, res.Header.Get(h))
		}
	}
}

// checkListed fails the test if a route answered with a status its Route
// (and so openapi.yaml) does not list, or a request no route takes with
// one x-unrouted does not, and reports whether a route took it.
func checkListed(t testing.TB, method, path string, status int) bool {
	t.Helper()
	mux := http.NewServeMux()
	var listed []int
	for _, rt := range Routes() {
		mux.HandleFunc(rt.Method+" "+rt.Path, func(http.ResponseWriter, *http.Request) { listed = rt.Statuses })
	}
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
	routed := listed != nil
	if !routed {
		listed = Unrouted
	}
	if !slices.Contains(listed, status) {
		t.Errorf("%s %s answered %d, which openapi.yaml does not list for it (%v)", method, path, status, listed)
	}
	return routed
}

func (f *fixture) post(key, body string, headers ...string) response {
	f.t.Helper()
	return f.do(http.MethodPost, "/v1/notifications", key, body, headers...)
}

const welcome = `{"recipient":"alice@example.com","template":"welcome","data":{"name":"Alice"}}`

func TestEnqueueOne(t *testing.T) {
	f := newFixture(t)
	r := f.post(billingKey, welcome)
	if r.status != http.StatusAccepted || r.body["state"] != "queued" || r.body["queued_at"] == nil {
		t.Fatalf("POST = %d %v, want 202, state queued and queued_at", r.status, r.body)
	}
	id := r.body["id"].(string)
	info, err := f.insp.GetTaskInfo("default", id)
	if err != nil {
		t.Fatal(err)
	}
	n, err := message.Decode(info.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if n.Recipient != "alice@example.com" || n.Tenant != "billing" || n.Policy != "marketing" || n.Provider != "console" || string(n.Data) != `{"name":"Alice"}` {
		t.Errorf("task payload %+v: want the body, the config's defaults and the key's tenant", n)
	}
	if info.Retention != 0 {
		t.Errorf("a task without an idempotency key kept %v after it is done, want 0", info.Retention)
	}
	got := f.do(http.MethodGet, "/v1/notifications/"+id, billingKey, "")
	if got.status != http.StatusOK || got.body["state"] != "queued" || got.body["tenant"] != "billing" {
		t.Errorf("GET = %d %v, want 200 queued", got.status, got.body)
	}
	if c := f.requests(t, "enqueue", "202"); c != 1 {
		t.Errorf("throttler_api_requests_total{route=enqueue,status=202} = %v, want 1", c)
	}
}

// requests returns throttler_api_requests_total of a route and status.
func (f *fixture) requests(t *testing.T, route, status string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if mf.GetName() == "throttler_api_requests_total" && labels["route"] == route && labels["status"] == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestIdempotency(t *testing.T) {
	f := newFixture(t)
	first := f.post(billingKey, welcome, IdempotencyHeader, "welcome-alice")
	if first.status != http.StatusAccepted {
		t.Fatalf("first POST = %d %v", first.status, first.body)
	}
	id := first.body["id"].(string)
	// The same notification, members in another order, the key in the body.
	again := f.post(billingKey, `{"data": {"name": "Alice"}, "template":"welcome", "recipient":"alice@example.com", "idempotency_key":"welcome-alice"}`)
	if again.status != http.StatusOK || again.body["id"] != id {
		t.Errorf("same key, same notification = %d %v, want 200 and id %s", again.status, again.body, id)
	}
	// Spacing inside data is no difference; a queue is.
	if r := f.post(billingKey, `{"recipient":"alice@example.com","template":"welcome","data":{ "name" : "Alice" }}`, IdempotencyHeader, "welcome-alice"); r.status != http.StatusOK {
		t.Errorf("the same data, spaced otherwise = %d %v, want 200", r.status, r.body)
	}
	if r := f.post(billingKey, `{"recipient":"alice@example.com","template":"welcome","data":{"name":"Alice"},"queue":"critical"}`, IdempotencyHeader, "welcome-alice"); r.status != http.StatusConflict {
		t.Errorf("the same in another queue = %d %v, want 409", r.status, r.body)
	}
	// A 409 names where the key came from.
	other := f.post(billingKey, `{"recipient":"alice@example.com","template":"goodbye"}`, IdempotencyHeader, "welcome-alice")
	if code, field := other.errorOf(t); other.status != http.StatusConflict || code != CodeConflict || field != IdempotencyHeader {
		t.Errorf("same key in the header, another notification = %d %s %s, want 409 %s %s", other.status, code, field, CodeConflict, IdempotencyHeader)
	}
	other = f.post(billingKey, `{"recipient":"alice@example.com","template":"goodbye","idempotency_key":"welcome-alice"}`)
	if code, field := other.errorOf(t); other.status != http.StatusConflict || code != CodeConflict || field != "/idempotency_key" {
		t.Errorf("same key in the body, another notification = %d %s %s, want 409 %s /idempotency_key", other.status, code, field, CodeConflict)
	}
	// Another tenant's key of the same name is another notification.
	growth := f.post(growthKey, welcome, IdempotencyHeader, "welcome-alice")
	if growth.status != http.StatusAccepted || growth.body["id"] == id {
		t.Errorf("the key from another tenant = %d %v, want 202 and a new id", growth.status, growth.body)
	}
	// GET by the key; another tenant's key does not find it.
	byKey := f.do(http.MethodGet, "/v1/notifications/welcome-alice", billingKey, "")
	if byKey.status != http.StatusOK || byKey.body["id"] != id {
		t.Errorf("GET by key = %d %v, want 200 and id %s", byKey.status, byKey.body, id)
	}
	if r := f.do(http.MethodGet, "/v1/notifications/"+id, slowKey, ""); r.status != http.StatusNotFound {
		t.Errorf("GET of another tenant's notification = %d %v, want 404", r.status, r.body)
	}
	info, err := f.insp.GetTaskInfo("default", id)
	if err != nil || info.Retention != 24*time.Hour {
		t.Errorf("keyed task: %v, retention %v; want kept 24h after it is done", err, info.Retention)
	}
	if q, _ := f.insp.GetQueueInfo("default"); q.Pending != 2 {
		t.Errorf("%d pending, want 2 (one per tenant)", q.Pending)
	}
}

func TestAuth(t *testing.T) {
	f := newFixture(t)
	for name, key := range map[string]string{"no key": "", "a wrong key": "billing-0123456789abcdeX"} {
		r := f.post(key, welcome)
		if code, field := r.errorOf(t); r.status != http.StatusUnauthorized || code != CodeUnauthorized || field != "Authorization" {
			t.Errorf("%s: %d %s %s, want 401 %s Authorization", name, r.status, code, field, CodeUnauthorized)
		}
	}
	r := f.do(http.MethodGet, "/v1/notifications/x", "", "")
	if r.status != http.StatusUnauthorized {
		t.Errorf("GET without a key = %d, want 401", r.status)
	}
}

func TestUnknownRoutes(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"PUT", "/v1/notifications", 405, "POST, GET"},
		{"PATCH", "/v1/notifications/abc", 405, "GET, DELETE"},
		{"GET", "/v1/notifications/batch", 200, ""}, // an ID like any other: not found
		{"GET", "/v2/notifications", 404, ""},
	} {
		r := f.do(c.method, c.path, billingKey, "")
		if c.status == 200 {
			if r.status != 404 {
				t.Errorf("%s %s = %d, want the 404 of an unknown ID", c.method, c.path, r.status)
			}
			continue
		}
		if code, _ := r.errorOf(t); r.status != c.status || r.header.Get("Allow") != c.allow || code == "" {
			t.Errorf("%s %s = %d %s Allow %q, want %d Allow %q", c.method, c.path, r.status, code, r.header.Get("Allow"), c.status, c.allow)
		}
	}
}

func TestForbidden(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name, body, field string
	}{
		{"a policy not allowed", `{"recipient":"a@example.com","template":"t","policy":"transactional"}`, "/policy"},
		{"a provider not allowed", `{"recipient":"a@example.com","template":"t","provider":"sms"}`, "/provider"},
		{"another tenant", `{"recipient":"a@example.com","template":"t","tenant":"billing"}`, "/tenant"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.post(growthKey, c.body)
			if code, field := r.errorOf(t); r.status != http.StatusForbidden || code != CodeForbidden || field != c.field {
				t.Errorf("%d %s %s, want 403 %s %s", r.status, code, field, CodeForbidden, c.field)
			}
		})
	}
	if r := f.post(growthKey, `{"recipient":"a@example.com","template":"t","tenant":"growth"}`); r.status != http.StatusAccepted {
		t.Errorf("its own tenant, named: %d %v, want 202", r.status, r.body)
	}
}

func TestBadBodies(t *testing.T) {
	f := newFixture(t)
	big := `{"recipient":"a@example.com","template":"t","data":{"x":"` + strings.Repeat("x", MaxBody) + `"}}`
	cases := []struct {
		name, body      string
		status          int
		field, inMesage string
	}{
		{"not JSON", `{"recipient":`, 400, "", "not JSON"},
		{"an array", `[1]`, 400, "", "must be a JSON object (got array)"},
		{"no recipient", `{"template":"t"}`, 400, "/recipient", "recipient: missing"},
		{"a misspelled field", `{"recipinet":"a","template":"t"}`, 400, "/recipinet", `unknown field "recipinet" (did you mean recipient?)`},
		{"a field twice", `{"recipient":"a","recipient":"b","template":"t"}`, 400, "/recipient", "recipient: given twice"},
		{"a number for a string", `{"recipient":7,"template":"t"}`, 400, "/recipient", "must be a string (got number)"},
		{"an undefined policy", `{"recipient":"a","template":"t","policy":"vip"}`, 400, "/policy", `policy "vip" is not defined`},
		{"a bad zone", `{"recipient":"a","template":"t","tz":"Mars/Olympus"}`, 400, "/tz", "tz: "},
		{"a past deadline", `{"recipient":"a","template":"t","send_by":"2001-01-01T00:00:00Z"}`, 400, "/send_by", "in the past"},
		{"too large", big, 413, "", "over 65536 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.post(billingKey, c.body)
			code, field := r.errorOf(t)
			msg := r.body["error"].(map[string]any)["message"].(string)
			if r.status != c.status || field != c.field || !strings.Contains(msg, c.inMesage) {
				t.Errorf("%d %s field %q %q, want %d field %q and a message with %q", r.status, code, field, msg, c.status, c.field, c.inMesage)
			}
		})
	}
	if r := f.post(billingKey, welcome, IdempotencyHeader, "a", "X", ""); r.status != 202 {
		t.Fatal(r.body)
	}
	r := f.post(billingKey, `{"recipient":"a","template":"t","idempotency_key":"b"}`, IdempotencyHeader, "a")
	if _, field := r.errorOf(t); r.status != 400 || field != "/idempotency_key" {
		t.Errorf("header and body keys differ: %d %s, want 400 /idempotency_key", r.status, field)
	}
	if q, _ := f.insp.GetQueueInfo("default"); q.Pending != 1 {
		t.Errorf("%d pending, want 1: only the good one", q.Pending)
	}
}

func TestBatch(t *testing.T) {
	f := newFixture(t)
	body := `{"notifications":[
		{"recipient":"a@example.com","template":"t","idempotency_key":"k1"},
		{"recipient":"b@example.com"},
		{"recipient":"c@example.com","template":"t","idempotency_key":"k1"},
		{"recipient":"d@example.com","template":"t"}]}`
	r := f.do(http.MethodPost, "/v1/notifications/batch", billingKey, body)
	if r.status != http.StatusOK {
		t.Fatalf("batch = %d %v", r.status, r.body)
	}
	results := r.body["results"].([]any)
	want := []struct {
		status int
		field  string
	}{{202, ""}, {400, "/notifications/1/template"}, {409, "/notifications/2/idempotency_key"}, {202, ""}}
	if len(results) != len(want) {
		t.Fatalf("%d results, want %d: %v", len(results), len(want), results)
	}
	for i, w := range want {
		res := results[i].(map[string]any)
		if int(res["status"].(float64)) != w.status {
			t.Errorf("result %d: %v, want status %d", i, res, w.status)
		}
		if e, ok := res["error"].(map[string]any); ok && e["field"] != w.field {
			t.Errorf("result %d: field %v, want %s", i, e["field"], w.field)
		}
		if n, ok := res["notification"].(map[string]any); (ok && n["state"] != "queued") || ok == (w.status >= 400) {
			t.Errorf("result %d: %v: a notification only when enqueued", i, res)
		}
	}
	again := f.do(http.MethodPost, "/v1/notifications/batch", billingKey, body)
	if s := again.body["results"].([]any)[0].(map[string]any)["status"]; s != 200.0 {
		t.Errorf("the batch again: first result %v, want 200 (the original)", s)
	}
	for name, c := range map[string]struct {
		body, field string
		status      int
	}{
		"empty":          {`{"notifications":[]}`, "/notifications", 400},
		"too many":       {`{"notifications":[` + strings.Repeat(`{},`, MaxBatch) + `{}]}`, "/notifications", 400},
		"unknown member": {`{"notification":[]}`, "", 400},
		"too large":      {`{"notifications":["` + strings.Repeat("x", MaxBatchBody) + `"]}`, "", 413},
	} {
		r := f.do(http.MethodPost, "/v1/notifications/batch", billingKey, c.body)
		if _, field := r.errorOf(t); r.status != c.status || field != c.field {
			t.Errorf("%s: %d %q, want %d %q", name, r.status, field, c.status, c.field)
		}
	}
}

func TestRateLimit(t *testing.T) {
	f := newFixture(t)
	for i := range 2 {
		if r := f.post(slowKey, welcome); r.status != http.StatusAccepted {
			t.Fatalf("request %d within the burst: %d %v", i+1, r.status, r.body)
		}
	}
	r := f.post(slowKey, welcome)
	code, _ := r.errorOf(t)
	if r.status != http.StatusTooManyRequests || code != CodeRateLimited || r.header.Get("Retry-After") != "2" {
		t.Errorf("over the burst: %d %s Retry-After %q, want 429 %s and 2 (0.5/s)", r.status, code, r.header.Get("Retry-After"), CodeRateLimited)
	}
	if r := f.post(billingKey, welcome); r.status != http.StatusAccepted {
		t.Errorf("another key: %d, want 202: a limit per key", r.status)
	}
	batch := `{"notifications":[` + strings.TrimSuffix(strings.Repeat(welcome+",", 3), ",") + `]}`
	if r := f.do(http.MethodPost, "/v1/notifications/batch", slowKey, batch); r.status != http.StatusBadRequest {
		t.Errorf("a batch over the key's burst: %d, want 400", r.status)
	}
}

func TestCancel(t *testing.T) {
	f := newFixture(t)
	id := f.post(billingKey, welcome, IdempotencyHeader, "k").body["id"].(string)
	r := f.do(http.MethodDelete, "/v1/notifications/k", billingKey, "")
	if r.status != http.StatusOK || r.body["state"] != "canceled" || r.body["id"] != id {
		t.Fatalf("DELETE = %d %v, want 200 canceled", r.status, r.body)
	}
	if info, err := f.insp.GetTaskInfo("default", id); err != nil || info.State != asynq.TaskStateArchived {
		t.Errorf("task after DELETE: %v %v, want archived", info, err)
	}
	if r := f.do(http.MethodGet, "/v1/notifications/"+id, billingKey, ""); r.body["state"] != "canceled" {
		t.Errorf("GET after DELETE = %v, want canceled", r.body)
	}
	if r := f.do(http.MethodDelete, "/v1/notifications/"+id, billingKey, ""); r.status != http.StatusOK {
		t.Errorf("DELETE again = %d, want 200", r.status)
	}
	if r := f.post(billingKey, welcome, IdempotencyHeader, "k"); r.status != http.StatusOK || r.body["state"] != "canceled" {
		t.Errorf("POST of the canceled key again = %d %v, want 200 and canceled: not sent after all", r.status, r.body)
	}
	// One the worker sent: its marker, the task completed and gone.
	sent := f.post(billingKey, `{"recipient":"b@example.com","template":"t"}`).body["id"].(string)
	if err := jobs.NewSentMarks(f.lim).Mark(context.Background(), sent, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := f.insp.DeleteTask("default", sent); err != nil {
		t.Fatal(err)
	}
	r = f.do(http.MethodDelete, "/v1/notifications/"+sent, billingKey, "")
	if code, _ := r.errorOf(t); r.status != http.StatusConflict || code != CodeAlreadySent {
		t.Errorf("DELETE of a sent one = %d %s, want 409 %s", r.status, code, CodeAlreadySent)
	}
	if r := f.do(http.MethodGet, "/v1/notifications/"+sent, billingKey, ""); r.body["state"] != "sent" || r.body["sent_at"] == nil {
		t.Errorf("GET of a sent one = %v, want sent with sent_at", r.body)
	}
	if r := f.do(http.MethodDelete, "/v1/notifications/nope", billingKey, ""); r.status != http.StatusNotFound {
		t.Errorf("DELETE of none = %d, want 404", r.status)
	}
}

// TestWaitingSaysUntilAndWhy: a notification the worker's handler defers
// (asynq's retry set, as cmd/worker configures asynq) is waiting, until
// its next try, for the deferral's reason.
func TestWaitingSaysUntilAndWhy(t *testing.T) {
	f := newFixture(t)
	id := f.post(billingKey, welcome).body["id"].(string)
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{
		Queues: map[string]int{"default": 1}, IsFailure: jobs.IsFailure, RetryDelayFunc: jobs.RetryDelay(0),
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel,
	})
	err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return &jobs.Deferral{Delay: time.Hour, Reason: "throttled by policy marketing (1 per 1h)"}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	var r response
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r = f.do(http.MethodGet, "/v1/notifications/"+id, billingKey, ""); r.body["state"] == "waiting" {
			break
		}
	}
	until, _ := time.Parse(time.RFC3339, fmt.Sprint(r.body["until"]))
	if r.body["state"] != "waiting" || r.body["reason"] != "throttled by policy marketing (1 per 1h); next try in 1h" ||
		time.Until(until) < 59*time.Minute || time.Until(until) > 61*time.Minute {
		t.Errorf("GET = %v, want waiting for about an hour, throttled by policy marketing", r.body)
	}
}
