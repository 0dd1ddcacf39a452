//go:build integration

package integration_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The API keys of the tests' configs.
const (
	apiKeyBilling = "billing-key-0123456789abcdef"
	apiKeyGrowth  = "growth-key-0123456789abcdef"
)

// apiFleet starts a worker whose config serves the API on a free port,
// with keys billing (anything) and growth (policy pace only), and returns
// the API's base URL.
func apiFleet(t *testing.T, policy string) (*fleet, string) {
	t.Helper()
	return apiFleetOn(t, policy, false)
}

// apiFleetOn is apiFleet, on a Redis Cluster of 3 masters if cluster.
func apiFleetOn(t *testing.T, policy string, cluster bool) (*fleet, string) {
	t.Helper()
	f, _, url := apiWorker(t, policy, cluster)
	return f, url
}

// apiWorker is apiFleetOn, which also returns its worker.
func apiWorker(t *testing.T, policy string, cluster bool) (*fleet, *workerProc, string) {
	t.Helper()
	addr := freeAddr(t)
	start := func(cfg fleetConfig) *fleet { return newFleet(t, cfg, nil) }
	if cluster {
		start = func(cfg fleetConfig) *fleet { return newClusterFleet(t, 3, 0, cfg, nil) }
	}
	f := start(fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: 0, Jitter: 0,
		Policy: policy, MorePolicies: "\n  other: [{limit: 5, per: 1h}]", Rate: 50, Burst: 10,
		API: fmt.Sprintf(`
  addr: %s
  keys:
    billing: {key: %s, tenant: billing}
    growth: {key: %s, tenant: growth, policies: [pace]}
`, addr, apiKeyBilling, apiKeyGrowth),
	})
	w := f.startWorker("w1")
	return f, w, "http://" + addr
}

// apiAnswer is an API response: its status and JSON body.
type apiAnswer struct {
	status int
	body   map[string]any
}

func (a apiAnswer) errorField() (code, field string) {
	e, _ := a.body["error"].(map[string]any)
	code, _ = e["code"].(string)
	field, _ = e["field"].(string)
	return code, field
}

// call sends one request to the API with a real HTTP client.
func call(t *testing.T, method, url, key, body string, headers ...string) apiAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	a := apiAnswer{status: res.StatusCode}
	if err := json.Unmarshal(data, &a.body); err != nil {
		t.Fatalf("%s %s: %d %q: not JSON: %v", method, url, res.StatusCode, data, err)
	}
	return a
}

// waitDelivered waits until the webhook accepted each of ids.
func waitDelivered(t *testing.T, f *fleet, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := f.hook.delivered()
		missing := 0
		for _, id := range ids {
			if got[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d notifications not delivered after 20s; delivered: %v", missing, len(ids), got)
		}
		select {
		case <-f.hook.arrived:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestAPIEnqueue: through the worker's API, with a real HTTP client, single
// and batch notifications reach the provider; a repeated idempotency key
// answers the first notification, a changed body with it 409; a wrong key
// is 401, a policy the key may not use 403, a malformed or oversized body
// 400 or 413 naming the field; canceling one that was sent says so.
func TestAPIEnqueue(t *testing.T) {
	t.Parallel() // no bound a busy core breaks: it runs beside the chaos runs
	f, base := apiFleet(t, "[{limit: 100, per: 1h}]")
	url := base + "/v1/notifications"
	one := `{"recipient":"alice@example.com","template":"welcome","data":{"name":"Alice"}}`
	first := call(t, "POST", url, apiKeyBilling, one, "Idempotency-Key", "welcome-alice")
	if first.status != 202 || first.body["state"] != "queued" {
		t.Fatalf("POST = %d %v, want 202 queued", first.status, first.body)
	}
	id := first.body["id"].(string)
	if again := call(t, "POST", url, apiKeyBilling, one, "Idempotency-Key", "welcome-alice"); again.status != 200 || again.body["id"] != id {
		t.Errorf("the same key again = %d %v, want 200 and %s", again.status, again.body, id)
	}
	changed := call(t, "POST", url, apiKeyBilling, `{"recipient":"alice@example.com","template":"goodbye"}`, "Idempotency-Key", "welcome-alice")
	if code, field := changed.errorField(); changed.status != 409 || code != "idempotency_conflict" || field != "Idempotency-Key" {
		t.Errorf("the key with another body = %d %v, want 409 idempotency_conflict naming the header it came in", changed.status, changed.body)
	}
	if r := call(t, "POST", url, "not-a-key-of-this-config", one); r.status != 401 {
		t.Errorf("a wrong key = %d %v, want 401", r.status, r.body)
	}
	forbidden := call(t, "POST", url, apiKeyGrowth, `{"recipient":"a@example.com","template":"t","policy":"other"}`)
	if code, field := forbidden.errorField(); forbidden.status != 403 || code != "forbidden" || field != "/policy" {
		t.Errorf("a forbidden policy = %d %v, want 403 forbidden /policy", forbidden.status, forbidden.body)
	}
	malformed := call(t, "POST", url, apiKeyBilling, `{"recipient":"a@example.com","template":"t","send_by":"tomorrow"}`)
	if code, field := malformed.errorField(); malformed.status != 400 || code != "invalid" || field != "/send_by" {
		t.Errorf("a malformed send_by = %d %v, want 400 invalid /send_by", malformed.status, malformed.body)
	}
	big := `{"recipient":"a@example.com","template":"t","data":{"x":"` + strings.Repeat("x", 70_000) + `"}}`
	if r := call(t, "POST", url, apiKeyBilling, big); r.status != 413 {
		t.Errorf("a body over 64 KiB = %d %v, want 413", r.status, r.body)
	}
	batch := call(t, "POST", url+"/batch", apiKeyBilling, `{"notifications":[
		{"recipient":"bob@example.com","template":"t"},
		{"recipient":"carol@example.com","template":"t","idempotency_key":"carol-1"},
		{"recipient":"dave@example.com","template":"t","bogus":1}]}`)
	results, _ := batch.body["results"].([]any)
	if batch.status != 200 || len(results) != 3 {
		t.Fatalf("batch = %d %v", batch.status, batch.body)
	}
	ids := []string{id}
	for i, want := range []float64{202, 202, 400} {
		r := results[i].(map[string]any)
		if r["status"] != want {
			t.Errorf("batch result %d: %v, want status %v", i, r, want)
		}
		if n, ok := r["notification"].(map[string]any); ok {
			ids = append(ids, n["id"].(string))
		}
	}
	if e, _ := results[2].(map[string]any)["error"].(map[string]any); e["field"] != "/notifications/2/bogus" {
		t.Errorf("batch result 2: %v, want the field /notifications/2/bogus", e)
	}
	waitDelivered(t, f, ids...)
	if got := f.hook.delivered(); len(got) != 3 || got[id] != 1 {
		t.Errorf("delivered %v, want each of %v once", got, ids)
	}
	var state apiAnswer
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if state = call(t, "GET", url+"/welcome-alice", apiKeyBilling, ""); state.body["state"] == "sent" {
			break
		}
	}
	if state.body["state"] != "sent" || state.body["id"] != id || state.body["tenant"] != "billing" {
		t.Errorf("GET by key after the send = %d %v, want sent", state.status, state.body)
	}
	late := call(t, "DELETE", url+"/"+id, apiKeyBilling, "")
	if code, _ := late.errorField(); late.status != 409 || code != "already_sent" {
		t.Errorf("DELETE after the send = %d %v, want 409 already_sent", late.status, late.body)
	}
}

// TestAPICancel: a notification the recipient's policy holds back waits,
// and says until when and why; canceled, it is never sent, while the one
// enqueued after it for the same recipient is.
func TestAPICancel(t *testing.T) {
	f, base := apiFleet(t, "[{limit: 1, per: 2s}]")
	url := base + "/v1/notifications"
	post := func(template string) string {
		t.Helper()
		r := call(t, "POST", url, apiKeyBilling, `{"recipient":"alice@example.com","template":"`+template+`"}`)
		if r.status != 202 {
			t.Fatalf("POST %s = %d %v", template, r.status, r.body)
		}
		return r.body["id"].(string)
	}
	first := post("first")
	waitDelivered(t, f, first)
	held := post("held")
	var state apiAnswer
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if state = call(t, "GET", url+"/"+held, apiKeyBilling, ""); state.body["state"] != "queued" && state.body["state"] != "sending" {
			break
		}
	}
	reason, _ := state.body["reason"].(string)
	if state.body["state"] != "waiting" || state.body["until"] == nil || !strings.Contains(reason, "policy pace") {
		t.Fatalf("GET of the held one = %v, want waiting, until, for policy pace", state.body)
	}
	canceled := call(t, "DELETE", url+"/"+held, apiKeyBilling, "")
	if canceled.status != 200 || canceled.body["state"] != "canceled" {
		t.Fatalf("DELETE = %d %v, want 200 canceled", canceled.status, canceled.body)
	}
	after := post("after")
	waitDelivered(t, f, after)
	if n := f.hook.delivered()[held]; n != 0 {
		t.Errorf("the canceled notification was delivered %d times", n)
	}
	if r := call(t, "GET", url+"/"+held, apiKeyBilling, ""); r.body["state"] != "canceled" {
		t.Errorf("GET after the cancel = %v, want canceled", r.body)
	}
}

// TestAPIOnlyNeedsNoProviderSecrets: worker -api-only serves the API from a
// config whose webhook header is {env: HOOK_TOKEN}, unset on its host, and
// enqueues, and takes a key added to the file at SIGHUP; a worker on that
// host stops at start, naming the variable.
func TestAPIOnlyNeedsNoProviderSecrets(t *testing.T) {
	addr, health := freeAddr(t), freeAddr(t)
	f := newFleet(t, fleetConfig{Concurrency: 1, ShutdownTimeout: time.Second, Policy: "[{limit: 100, per: 1h}]", Rate: 10, Burst: 10,
		API: fmt.Sprintf("\n  addr: %s\n  keys:\n    billing: {key: %s, tenant: billing}\n", addr, apiKeyBilling)}, nil)
	path := f.writeConfig("api", health)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(strings.Replace(string(data), "headers: {X-Worker: api}", "headers: {X-Worker: api, Authorization: {env: HOOK_TOKEN}}", 1))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := buildBinary(t, "worker")
	_, stderr, code := runCommand(t, f.dir, nil, bin, "-config", path)
	if want := "providers.hook.headers.Authorization: environment variable HOOK_TOKEN is not set or empty"; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("a worker without HOOK_TOKEN: status %d, stderr %q; want 1 and %q", code, stderr, want)
	}
	cmd := exec.Command(bin, "-api-only", "-config", path)
	cmd.Env = slices.DeleteFunc(childEnv(), func(kv string) bool { return strings.HasPrefix(kv, "HOOK_TOKEN=") })
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // our own child, by its handle
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("--- worker -api-only output ---\n%s", out.String())
		}
	})
	var r apiAnswer
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get("http://" + health + "/healthz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker -api-only not healthy after 20s:\n%s", out.String())
		}
	}
	r = call(t, "POST", "http://"+addr+"/v1/notifications", apiKeyBilling, `{"recipient":"alice@example.com","template":"welcome"}`)
	if r.status != 202 {
		t.Fatalf("POST to worker -api-only = %d %v, want 202", r.status, r.body)
	}
	if info, err := f.insp.GetTaskInfo(fleetQueue, r.body["id"].(string)); err != nil || info.State.String() != "pending" {
		t.Errorf("the task: %v %v, want pending: -api-only delivers nothing", info, err)
	}
	// SIGHUP reloads -api-only's keys too.
	const opsKey = "ops-key-0123456789abcdef"
	billing := fmt.Sprintf("billing: {key: %s, tenant: billing}\n", apiKeyBilling)
	data = []byte(strings.Replace(string(data), billing, billing+fmt.Sprintf("    ops: {key: %s, tenant: ops}\n", opsKey), 1))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "api reloaded"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no \"api reloaded\" in worker -api-only's log after SIGHUP")
		}
	}
	if r := call(t, "POST", "http://"+addr+"/v1/notifications", opsKey, `{"recipient":"bob@example.com","template":"welcome"}`); r.status != 202 {
		t.Errorf("POST with a key added by SIGHUP = %d %v, want 202", r.status, r.body)
	}
}

// TestAPIOnCluster: on a Redis Cluster, a keyed notification is enqueued
// once, reaches the webhook, and is then found sent by its key; a held one
// is canceled and never sent. Every request passes the key's rate limit,
// the throttle's bucket on the cluster.
func TestAPIOnCluster(t *testing.T) {
	f, base := apiFleetOn(t, "[{limit: 1, per: 2s}]", true)
	url := base + "/v1/notifications"
	one := `{"recipient":"alice@example.com","template":"welcome"}`
	first := call(t, "POST", url, apiKeyBilling, one, "Idempotency-Key", "c1")
	again := call(t, "POST", url, apiKeyBilling, one, "Idempotency-Key", "c1")
	if first.status != 202 || again.status != 200 || again.body["id"] != first.body["id"] {
		t.Fatalf("POST, POST again = %d %v, %d %v; want 202, then 200 and the same id", first.status, first.body, again.status, again.body)
	}
	id := first.body["id"].(string)
	waitDelivered(t, f, id)
	held := call(t, "POST", url, apiKeyBilling, `{"recipient":"alice@example.com","template":"later"}`)
	if r := call(t, "DELETE", url+"/"+held.body["id"].(string), apiKeyBilling, ""); r.status != 200 || r.body["state"] != "canceled" {
		t.Errorf("DELETE of the held one = %d %v, want 200 canceled", r.status, r.body)
	}
	var state apiAnswer
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if state = call(t, "GET", url+"/c1", apiKeyBilling, ""); state.body["state"] == "sent" {
			break
		}
	}
	if state.body["state"] != "sent" {
		t.Errorf("GET by key = %v, want sent", state.body)
	}
	after := call(t, "POST", url, apiKeyBilling, `{"recipient":"alice@example.com","template":"after"}`)
	waitDelivered(t, f, after.body["id"].(string))
	if got := f.hook.delivered(); len(got) != 2 {
		t.Errorf("delivered %v, want the first and the one after the canceled one", got)
	}
}

// TestAPIReloadsKeysOnSIGHUP: a key and a policy added to the config file
// are taken by the worker's API after SIGHUP, without a restart, and a key
// removed is refused.
func TestAPIReloadsKeysOnSIGHUP(t *testing.T) {
	f, w, base := apiWorker(t, "[{limit: 5, per: 1h}]", false)
	url := base + "/v1/notifications"
	const opsKey = "ops-key-0123456789abcdef"
	vip := `{"recipient":"a@example.com","template":"t","policy":"vip"}`
	if r := call(t, "POST", url, opsKey, `{"recipient":"a@example.com","template":"t"}`); r.status != 401 {
		t.Fatalf("a key not yet in the config = %d %v, want 401", r.status, r.body)
	}
	if r := call(t, "POST", url, apiKeyBilling, vip); r.status != 400 {
		t.Fatalf("a policy not yet in the config = %d %v, want 400", r.status, r.body)
	}
	addr := strings.TrimPrefix(base, "http://")
	f.cfg.MorePolicies += "\n  vip: [{limit: 5, per: 1h}]"
	f.cfg.API = fmt.Sprintf(`
  addr: %s
  keys:
    billing: {key: %s, tenant: billing}
    ops: {key: %s, tenant: ops}
`, addr, apiKeyBilling, opsKey)
	f.writeConfig(w.name, w.metrics)
	if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(w.out.String(), "api reloaded"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no \"api reloaded\" in the worker's log after SIGHUP:\n%s", w.out.String())
		}
	}
	if r := call(t, "POST", url, opsKey, `{"recipient":"a@example.com","template":"t"}`); r.status != 202 || r.body["tenant"] != "ops" {
		t.Errorf("the key added = %d %v, want 202 as tenant ops", r.status, r.body)
	}
	if r := call(t, "POST", url, apiKeyBilling, vip); r.status != 202 {
		t.Errorf("the policy added = %d %v, want 202", r.status, r.body)
	}
	if r := call(t, "POST", url, apiKeyGrowth, `{"recipient":"a@example.com","template":"t"}`); r.status != 401 {
		t.Errorf("the key removed = %d %v, want 401", r.status, r.body)
	}
}
