package campaign

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
)

// testCampaign is the campaigns section the tests start from: digest, whose
// audience file the test writes.
const testCampaign = `
  - name: digest
    cron: "@every 1h"
    template: digest
    data: {title: Your week}
    audience: {file: audience.txt}
`

// testConfig writes a config with the given campaigns section and audience
// file contents into a temp dir and loads it; addr is host:port[/db].
func testConfig(t testing.TB, addr, campaigns, audience string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "audience.txt"), []byte(audience), 0o644); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`redis: {url: "redis://%s"}
worker: {queues: {default: 1, low: 1}}
policies: {weekly: [{limit: 1, per: 168h}]}
providers: {console: {type: log, rate: 1000, burst: 100}}
defaults: {policy: weekly, provider: console}
campaigns:%s`, addr, campaigns)
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadWithEnv(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testRunner returns a Runner of the config testConfig writes, on a fresh
// database of the package's shared server, and its client.
func testRunner(t testing.TB, campaigns, audience string, opts Options) (*Runner, *redis.Client) {
	t.Helper()
	rdb, db := shared.NewClient(t)
	addr := fmt.Sprintf("%s/%d", shared.Addr, db)
	return newRunner(t, testConfig(t, addr, campaigns, audience), rdb, opts), rdb
}

func newRunner(t testing.TB, cfg *config.Config, rdb redis.UniversalClient, opts Options) *Runner {
	t.Helper()
	if opts.Log == nil {
		opts.Log = testLog(t)
	}
	r, err := New(cfg, rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// testLog logs to the test's log when -v is set.
func testLog(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(tlogWriter{t}, nil))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// lines returns n recipients, one per line: user0@example.com ...
func lines(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "user%d@example.com\n", i)
	}
	return b.String()
}

// pendingIDs returns the IDs on queue's pending list, and fails the test
// if one is there twice.
func pendingIDs(t testing.TB, rdb redis.UniversalClient, queue string) map[string]bool {
	t.Helper()
	ids, err := rdb.LRange(context.Background(), "asynq:{"+queue+"}:pending", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, id := range ids {
		if set[id] {
			t.Errorf("task %s is on the pending list twice", id)
		}
		set[id] = true
	}
	return set
}

// recentTick is a tick a minute ago: recent enough for every check.
func recentTick(name string) Tick { return NewTick(name, time.Now().Add(-time.Minute)) }

// twin returns another Runner of r's campaigns, as another worker would run.
func twin(r *Runner) *Runner {
	return &Runner{rdb: r.rdb, client: r.client, prefix: r.prefix, shards: r.shards, campaigns: r.campaigns, names: r.names,
		opts: r.opts, log: r.log, stop: make(chan struct{})}
}
