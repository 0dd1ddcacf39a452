package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/message"
)

// keys returns the sorted keys of a JSON object.
func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestAPIShapes checks the fields of every JSON answer.
func TestAPIShapes(t *testing.T) {
	e := newEnv(t, "", nil)
	e.admit(t, "t1", "alice@example.com", "marketing", "sms")
	pageKeys := []string{"items", "limit", "offset", "total"}
	tests := []struct {
		path string
		item []string // the keys of the first item
	}{
		{"/throttle/api/providers", []string{"bin_seconds", "booked_ahead_seconds", "bookings", "bookings_held", "burst", "name", "now",
			"paused", "paused_until", "priority_reserve", "rate", "sends_per_second", "shadow", "tokens", "type"}},
		{"/throttle/api/policies", []string{"calendar", "counts_toward", "deferred_by_this_worker", "max_delay", "name", "over_cap",
			"quiet", "shadow", "timezone", "windows"}},
		{"/throttle/api/campaigns", []string{"cron", "fanout_done", "fanout_enqueued", "fanout_existing", "fanout_invalid", "fanout_read",
			"last_tick", "name", "next_tick", "timezone"}},
	}
	for _, tt := range tests {
		var got map[string]any
		e.getJSON(t, tt.path, &got)
		if k := keys(got); !reflect.DeepEqual(k, pageKeys) {
			t.Errorf("%s: keys %v, want %v", tt.path, k, pageKeys)
			continue
		}
		items, _ := got["items"].([]any)
		if len(items) == 0 {
			t.Errorf("%s: no items", tt.path)
			continue
		}
		if k := keys(items[0].(map[string]any)); !reflect.DeepEqual(k, tt.item) {
			t.Errorf("%s: item keys (-want +got)\n-%v\n+%v", tt.path, tt.item, k)
		}
	}
	// The values are the config's, not placeholders (over_cap was "defer"
	// for every policy); TestPoliciesShowTheRunningConfig checks each.
	var pols page[policyView]
	e.getJSON(t, "/throttle/api/policies", &pols)
	for _, p := range pols.Items {
		if want := e.cfg.Policies[p.Name].OverCap; p.OverCap != want || want == "" {
			t.Errorf("policy %s: over_cap %q, want the config's %q", p.Name, p.OverCap, want)
		}
	}
	var r map[string]any
	e.getJSON(t, "/throttle/api/recipients/alice@example.com", &r)
	want := []string{"booked_ahead_seconds", "bookings", "bookings_held", "now", "policies", "recipient", "zone"}
	if k := keys(r); !reflect.DeepEqual(k, want) {
		t.Errorf("recipient keys (-want +got)\n-%v\n+%v", want, k)
	}
	pol := r["policies"].([]any)[0].(map[string]any)
	want = []string{"decided_by", "entries", "held_by", "next", "next_in_seconds", "policy", "provider", "rules", "windows", "zone"}
	if k := keys(pol); !reflect.DeepEqual(k, want) {
		t.Errorf("recipient policy keys (-want +got)\n-%v\n+%v", want, k)
	}
	w := pol["windows"].([]any)[0].(map[string]any)
	want = []string{"booked", "frees", "limit", "per", "per_seconds", "used"}
	if k := keys(w); !reflect.DeepEqual(k, want) {
		t.Errorf("recipient window keys (-want +got)\n-%v\n+%v", want, k)
	}
}

// TestRecipientThrottled checks a throttled recipient's next moment and the
// rule that decides it against the engine's own decision.
func TestRecipientThrottled(t *testing.T) {
	e := newEnv(t, "", nil)
	e.admit(t, "first", "alice@example.com", "marketing", "sms")
	d := e.admit(t, "second", "alice@example.com", "marketing", "push")
	if d.Allowed() {
		t.Fatal("second admission allowed")
	}
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/alice@example.com?tz=Europe/Paris", &r)
	if r.Zone != "Europe/Paris" || r.Recipient != "alice@example.com" {
		t.Errorf("recipient %q in %q", r.Recipient, r.Zone)
	}
	var m *recipientPolicy
	for i := range r.Policies {
		if r.Policies[i].Policy == "marketing" {
			m = &r.Policies[i]
		}
	}
	if m == nil {
		t.Fatalf("no marketing policy in %+v", r.Policies)
	}
	if !m.Next.Equal(d.At()) || m.DecidedBy != "1 per 24h" {
		t.Errorf("next %s by %q, want the engine's %s by 1 per 24h", m.Next, m.DecidedBy, d.At())
	}
	if _, off := m.Next.Zone(); off == 0 {
		t.Errorf("next %s is not in Europe/Paris", m.Next)
	}
	if m.Entries.Total != 1 || m.Entries.Items[0].Task != "first" || m.Windows[0].Used != 1 {
		t.Errorf("entries %+v, windows %+v", m.Entries, m.Windows)
	}
}

// TestUnknownRecipientIsEmpty: an id with no history is not an error.
func TestUnknownRecipientIsEmpty(t *testing.T) {
	e := newEnv(t, "", nil)
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/"+url.PathEscape("nobody {at} example.com"), &r)
	if r.Recipient != "nobody {at} example.com" || len(r.Policies) != 2 {
		t.Fatalf("recipient %+v", r)
	}
	for _, p := range r.Policies {
		if p.Entries.Total != 0 || len(p.Entries.Items) != 0 || p.DecidedBy != "" || p.NextIn != 0 {
			t.Errorf("policy %s of an unknown recipient: %+v", p.Policy, p)
		}
	}
	var slash recipientView
	e.getJSON(t, "/throttle/api/recipients/"+url.PathEscape("team/ops@example.com"), &slash)
	if slash.Recipient != "team/ops@example.com" {
		t.Errorf("an id with a slash, escaped: recipient %q", slash.Recipient)
	}
	code, body := e.get(t, "/throttle?recipient=nobody")
	if code != http.StatusOK || !strings.Contains(body, "No entries") {
		t.Errorf("page of an unknown recipient: %d\n%s", code, body)
	}
}

// TestBadRequests: a malformed id, page or zone is 400 with what is wrong.
func TestBadRequests(t *testing.T) {
	e := newEnv(t, "", nil)
	long := strings.Repeat("x", 300)
	tests := []struct{ path, want string }{
		{"/throttle/api/recipients/" + long, "recipient: 300 bytes, longer than 256"},
		{"/throttle/api/recipients/bad%FFutf8", "recipient: not UTF-8"},
		{"/throttle/api/recipients/alice?offset=-1", `offset: must be a whole number >= 0 (got "-1")`},
		{"/throttle/api/providers?limit=0", `limit: must be a whole number from 1 to 500 (got "0")`},
		{"/throttle/api/policies?limit=lots", `limit: must be a whole number from 1 to 500 (got "lots")`},
		{"/throttle/api/recipients/alice?tz=Mars/Olympus", `tz: unknown time zone "Mars/Olympus" (an IANA zone such as Europe/Paris)`},
	}
	for _, tt := range tests {
		code, body := e.get(t, tt.path)
		var got map[string]string
		_ = json.Unmarshal([]byte(body), &got)
		if code != http.StatusBadRequest || got["error"] != tt.want {
			t.Errorf("GET %.60s: %d %s, want 400 %q", tt.path, code, body, tt.want)
		}
	}
	code, body := e.get(t, "/throttle?recipient="+long)
	if code != http.StatusBadRequest || !strings.Contains(body, "recipient: 300 bytes, longer than 256") {
		t.Errorf("page with a long id: %d, want 400 with the message", code)
	}
	code, _ = e.get(t, "/throttle?recipient=")
	if code != http.StatusBadRequest {
		t.Errorf("page with an empty id: %d, want 400", code)
	}
}

// TestPagination follows next links through providers and a recipient's
// entries.
func TestPagination(t *testing.T) {
	e := newEnv(t, "", nil)
	for i := 0; i < 7; i++ {
		if d := e.admit(t, fmt.Sprintf("t%d", i), "bob", "transactional", "push"); !d.Allowed() {
			t.Fatalf("admission %d denied", i)
		}
	}
	var names []string
	for path := "/throttle/api/providers?limit=2"; path != ""; {
		var p page[providerView]
		e.getJSON(t, path, &p)
		if p.Total != 3 || len(p.Items) > 2 {
			t.Fatalf("%s: total %d, %d items", path, p.Total, len(p.Items))
		}
		for _, it := range p.Items {
			names = append(names, it.Name)
		}
		path = p.Next
	}
	if want := []string{"email", "push", "sms"}; !reflect.DeepEqual(names, want) {
		t.Errorf("providers over pages = %v, want %v", names, want)
	}
	seen := map[string]bool{}
	pages := 0
	for path := "/throttle/api/recipients/bob?limit=3"; path != ""; pages++ {
		var r recipientView
		e.getJSON(t, path, &r)
		var tr *recipientPolicy
		for i := range r.Policies {
			if r.Policies[i].Policy == "transactional" {
				tr = &r.Policies[i]
			}
		}
		if tr.Entries.Total != 7 {
			t.Fatalf("total %d, want 7", tr.Entries.Total)
		}
		for _, it := range tr.Entries.Items {
			seen[it.Task] = true
		}
		path = tr.Entries.Next
	}
	if len(seen) != 7 || pages != 3 {
		t.Errorf("%d pages gave %d distinct tasks, want 3 pages of the 7", pages, len(seen))
	}
}

// TestAuth: 401 without the right credentials, 200 with them, on the
// throttle view, its API and the asynq dashboard; /healthz and /metrics are
// not the dashboard's.
func TestAuth(t *testing.T) {
	secret := "s3cret-token"
	bearer := newEnv(t, "  dashboard: {auth: bearer}\n", nil, func(o *Options) { o.Secret = secret })
	basic := newEnv(t, "  dashboard: {auth: basic, username: ops}\n", nil, func(o *Options) { o.Secret = secret })
	paths := []string{"/throttle", "/throttle/api/providers", "/throttle/api/recipients/alice", "/monitoring/", "/monitoring/api/queues"}
	for _, p := range paths {
		for _, c := range []struct {
			name   string
			e      *env
			header []string
			want   int
		}{
			{"bearer, none", bearer, nil, 401},
			{"bearer, wrong", bearer, []string{"Authorization", "Bearer nope"}, 401},
			{"bearer, basic instead", bearer, []string{"Authorization", "Basic b3BzOnMzY3JldC10b2tlbg=="}, 401},
			{"bearer, right", bearer, []string{"Authorization", "Bearer " + secret}, 200},
			{"basic, none", basic, nil, 401},
			{"basic, wrong user", basic, []string{"Authorization", "Basic YWRtaW46czNjcmV0LXRva2Vu"}, 401}, // admin:s3cret-token
			{"basic, right", basic, []string{"Authorization", "Basic b3BzOnMzY3JldC10b2tlbg=="}, 200},      // ops:s3cret-token
		} {
			code, body := c.e.get(t, p, c.header...)
			if code != c.want {
				t.Errorf("%s %s: %d, want %d (%.80s)", c.name, p, code, c.want, body)
			}
			if code == 401 && strings.Contains(body, secret) {
				t.Errorf("%s %s: the 401 shows the secret", c.name, p)
			}
		}
	}
}

// TestMonitoringReadOnly: without actions, asynq's dashboard refuses
// anything but GET; with them, it passes the request on.
func TestMonitoringReadOnly(t *testing.T) {
	ro := newEnv(t, "", nil)
	rw := newEnv(t, "  dashboard: {actions: true}\n", nil)
	for _, e := range []*env{ro, rw} {
		client := asynq.NewClientFromRedisClient(e.rdb)
		if _, err := client.Enqueue(asynq.NewTask("noop", nil), asynq.Queue("default")); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := ro.do(t, http.MethodPost, "/monitoring/api/queues/default:pause"); code != http.StatusMethodNotAllowed ||
		!strings.Contains(body, "read-only") {
		t.Errorf("read-only pause: %d %s, want 405", code, body)
	}
	if code, _ := ro.do(t, http.MethodDelete, "/monitoring/api/queues/default"); code != http.StatusMethodNotAllowed {
		t.Errorf("read-only delete: %d, want 405", code)
	}
	if code, body := rw.do(t, http.MethodPost, "/monitoring/api/queues/default:pause"); code != http.StatusNoContent && code != http.StatusOK {
		t.Errorf("pause with actions: %d %s, want it done", code, body)
	}
	paused, err := asynq.NewInspectorFromRedisClient(rw.rdb).GetQueueInfo("default")
	if err != nil || !paused.Paused {
		t.Errorf("queue after a pause with actions: %+v, %v", paused, err)
	}
}

// TestMonitoringRedactsRecipients: a notification's payload in asynq's
// dashboard shows the recipient redacted.
func TestMonitoringRedactsRecipients(t *testing.T) {
	e := newEnv(t, "", nil)
	task, err := message.NewTask(message.Notification{Recipient: "alice.liddell@example.com", Policy: "marketing", Provider: "sms", Template: "hi"},
		"redact-me", asynq.Queue("default"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	code, body := e.get(t, "/monitoring/api/queues/default/pending_tasks")
	if code != 200 || !strings.Contains(body, "redact-me") {
		t.Fatalf("pending tasks: %d %s", code, body)
	}
	if strings.Contains(body, "liddell") {
		t.Errorf("the recipient shows in the dashboard:\n%s", body)
	}
	if !strings.Contains(body, `a***@example.com`) {
		t.Errorf("the redacted recipient is not shown:\n%s", body)
	}
}

// TestPoliciesCountDeferrals: the policies show this worker's deferral
// counts from its metrics, every limit of a policy together.
func TestPoliciesCountDeferrals(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := jobs.NewMetrics(reg)
	m.Deferred.WithLabelValues("policy marketing (1 per 24h)").Add(2)
	m.Deferred.WithLabelValues("policy marketing (3 per 168h)").Inc()
	m.Deferred.WithLabelValues("provider sms (2/s)").Inc()
	e := newEnv(t, "", nil, func(o *Options) { o.Metrics = reg })
	var p page[policyView]
	e.getJSON(t, "/throttle/api/policies", &p)
	got := map[string]float64{}
	for _, it := range p.Items {
		got[it.Name] = *it.Deferred
	}
	if want := map[string]float64{"marketing": 3, "transactional": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("deferred = %v, want %v", got, want)
	}
}

// TestRedisDownIs503: with Redis unreachable a view says so with 503, not
// an empty page that would read as "nothing throttled".
func TestRedisDownIs503(t *testing.T) {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	e := newEnv(t, "", down)
	for _, p := range []string{"/throttle", "/throttle/api/providers", "/throttle/api/recipients/alice", "/throttle/api/campaigns"} {
		if code, body := e.get(t, p); code != http.StatusServiceUnavailable {
			t.Errorf("GET %s with Redis down: %d %.100s, want 503", p, code, body)
		}
	}
}

// TestMonitoringRedactsDigestRecipients: a digest task's payload shows its
// recipient redacted too.
func TestMonitoringRedactsDigestRecipients(t *testing.T) {
	e := newEnv(t, "", nil)
	task := asynq.NewTask(digest.TaskType, []byte(`{"recipient":"alice.liddell@example.com","policy":"marketing","provider":"sms","gen":1}`),
		asynq.TaskID("digest-me"), asynq.Queue("default"))
	if _, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	code, body := e.get(t, "/monitoring/api/queues/default/pending_tasks")
	if code != 200 || !strings.Contains(body, "digest-me") {
		t.Fatalf("pending tasks: %d %s", code, body)
	}
	if strings.Contains(body, "liddell") || !strings.Contains(body, `a***@example.com`) {
		t.Errorf("the digest's recipient is not shown redacted:\n%s", body)
	}
}
