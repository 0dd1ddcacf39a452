package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/providers"
)

// TestProvidersUncountedOutsideTheDemo checks that a worker not running the
// demo sends through its providers as configured: the demo's per-recipient
// send counter (a mutex per send and a map entry per recipient, kept for the
// life of the process) wraps them only in demo mode.
func TestProvidersUncountedOutsideTheDemo(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Nothing connects: the limiter only holds the client.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	th, _, err := newThrottle(cfg, rdb, prometheus.NewRegistry(), log, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range th.Providers {
		switch r.Provider.(type) {
		case *providers.Log, *providers.Webhook:
		default:
			t.Errorf("provider %s is a %T outside the demo, want the configured provider itself", name, r.Provider)
		}
	}

	counts := newSentCounts()
	th, _, err = newThrottle(cfg, rdb, prometheus.NewRegistry(), log, io.Discard, counts)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range th.Providers {
		if _, ok := r.Provider.(providers.Func); !ok {
			t.Errorf("provider %s is a %T in the demo, want it wrapped by the send counter", name, r.Provider)
		}
	}
}

// TestMissingDashboardSecretStopsAtStart: a dashboard that asks for auth
// whose secret is not in the environment stops the worker before it
// connects to anything (the config's Redis is a port nothing listens on,
// which a connecting worker would wait for), naming the variable.
func TestMissingDashboardSecretStopsAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.yaml")
	yaml := "redis: {url: \"redis://127.0.0.1:1/0\"}\n" +
		"worker: {http_addr: \"0.0.0.0:9999\", dashboard: {auth: bearer, secret_env: THROTTLER_TEST_UNSET_SECRET}}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("THROTTLER_TEST_UNSET_SECRET", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"-config", path}, io.Discard, io.Discard)
	want := "worker.dashboard.auth: is bearer, but the environment variable THROTTLER_TEST_UNSET_SECRET that holds its secret is not set or empty"
	if err == nil || err.Error() != want {
		t.Errorf("run = %v\nwant %s", err, want)
	}
	if ctx.Err() != nil {
		t.Error("the worker waited for Redis before checking the secret")
	}
}
