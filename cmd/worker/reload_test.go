package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
)

// TestReloadReplacesTheRunningConfig: a valid file replaces the config the
// dashboard reads (the running pointer) and counts a success; a file with a
// mistake is refused, counted as such, and the running config stays.
func TestReloadReplacesTheRunningConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const yaml = "redis: {url: \"redis://127.0.0.1:1/0\"}\nworker: {http_addr: \"\"}\n" +
		"policies: {marketing: {windows: [{limit: 1, per: 24h}], over_cap: %s}}\n" +
		"providers: {sms: {type: log, output: stderr, rate: 2, burst: 1}}\ndefaults: {policy: marketing, provider: sms}\n"
	write(strings.Replace(yaml, "%s", "defer", 1))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // nothing connects
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	th, built, err := newThrottle(cfg, rdb, reg, log, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	running := &atomic.Pointer[config.Config]{}
	running.Store(cfg)
	r := &reloader{path: path, running: running, senders: built, th: th, stdout: io.Discard, stderr: io.Discard, log: log,
		reloads: newReloads(reg)}
	count := func(result string) float64 { return testutil.ToFloat64(r.reloads.WithLabelValues(result)) }

	write(strings.Replace(yaml, "%s", "drop", 1))
	r.reload(context.Background())
	if got := running.Load().Policies["marketing"].OverCap; got != "drop" || count(reloadSuccess) != 1 || count(reloadRefused) != 0 {
		t.Errorf("after a valid reload: over_cap %q, reloads success %g refused %g; want drop, 1, 0", got, count(reloadSuccess), count(reloadRefused))
	}
	write(strings.Replace(yaml, "%s", "shred", 1))
	r.reload(context.Background())
	if got := running.Load().Policies["marketing"].OverCap; got != "drop" || count(reloadSuccess) != 1 || count(reloadRefused) != 1 {
		t.Errorf("after a refused reload: over_cap %q, reloads success %g refused %g; want drop, 1, 1", got, count(reloadSuccess), count(reloadRefused))
	}
}

// TestMetricsHaveRuntimeSeries: /metrics has the Go runtime's and the
// process's series beside the throttler's, and the build.
func TestMetricsHaveRuntimeSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	processMetrics(reg)
	newReloads(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes",
		"process_cpu_seconds_total", "process_open_fds", "throttler_build_info", "throttler_config_reloads_total"} {
		if !have[name] {
			t.Errorf("no %s among the metrics", name)
		}
	}
}
