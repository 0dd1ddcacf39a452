package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

// testYAML is the config the tests start from: %s is the worker section's
// extra lines.
const testYAML = `
worker:
  queues: {default: 1}
%s
policies:
  marketing: [{limit: 1, per: 24h}, {limit: 3, per: 168h}]
  transactional: [{limit: 20, per: 1h}]
providers:
  email: {type: log, rate: 5, burst: 2}
  push: {type: log, rate: 1000, burst: 100}
  sms: {type: log, rate: 2, burst: 1}
defaults: {policy: marketing, provider: sms}
campaigns:
  - {name: digest, cron: "0 9 * * MON", timezone: Europe/Paris, audience: {redis_set: digest}, template: digest}
`

// env is a dashboard on a redis-server of its own, with an engine to make
// history with.
type env struct {
	rdb   redis.UniversalClient
	cfg   *config.Config
	lim   *throttle.Limiter
	srv   *httptest.Server
	cmds  *atomic.Int64 // Redis commands sent, through the counting hook
	scans *atomic.Int64 // of which SCAN, KEYS and the like
	rules struct {
		quotas  map[string]*throttle.Quota
		buckets map[string]*throttle.Bucket
	}
}

type dashOpt func(*Options)

func newEnv(t testing.TB, workerYAML string, rdb redis.UniversalClient, opts ...dashOpt) *env {
	t.Helper()
	return newEnvYAML(t, fmt.Sprintf(testYAML, workerYAML), rdb, opts...)
}

// newEnvYAML is newEnv with a config of the test's own.
func newEnvYAML(t testing.TB, yaml string, rdb redis.UniversalClient, opts ...dashOpt) *env {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if rdb == nil {
		rdb, _ = shared.NewClient(t)
	}
	e := &env{rdb: rdb, cfg: cfg, cmds: &atomic.Int64{}, scans: &atomic.Int64{}}
	rdb.AddHook(counter{e.cmds, e.scans})
	if e.lim, err = throttle.New(rdb, throttle.Options{}); err != nil {
		t.Fatal(err)
	}
	if e.rules.quotas, e.rules.buckets, err = cfg.Rules(); err != nil {
		t.Fatal(err)
	}
	runner, err := campaign.New(cfg, rdb, campaign.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Redis: rdb, Config: cfg, Campaigns: runner}
	for _, f := range opts {
		f(&o)
	}
	e.srv = httptest.NewServer(New(o))
	t.Cleanup(e.srv.Close)
	return e
}

// admit admits task id for recipient under policy through provider.
func (e *env) admit(t testing.TB, id, recipient, policy, provider string) throttle.Decision {
	t.Helper()
	d, err := e.lim.Admit(context.Background(), throttle.Request{ID: id, Takes: []throttle.Take{
		{Rule: e.rules.quotas[policy], Subject: recipient}, {Rule: e.rules.buckets[provider], Subject: provider}}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// get fetches path with the given headers and returns the status and body.
func (e *env) get(t testing.TB, path string, header ...string) (int, string) {
	t.Helper()
	return e.do(t, http.MethodGet, path, header...)
}

func (e *env) do(t testing.TB, method, path string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// getJSON fetches path, wants 200 and decodes the body into v.
func (e *env) getJSON(t testing.TB, path string, v any) {
	t.Helper()
	code, body := e.get(t, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
}

// counter is a go-redis hook counting the commands sent, and the keyspace
// walks among them.
type counter struct{ n, scans *atomic.Int64 }

func (c counter) count(cmds ...redis.Cmder) {
	c.n.Add(int64(len(cmds)))
	for _, cmd := range cmds {
		switch cmd.Name() {
		case "scan", "keys", "sscan", "hscan", "zscan":
			c.scans.Add(1)
		}
	}
}

func (c counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds...)
		return next(ctx, cmds)
	}
}
