package main

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/jobs"
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

	th, err := newThrottle(cfg, rdb, prometheus.NewRegistry(), log, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range th.Providers {
		switch r.Provider.(type) {
		case *jobs.LogProvider, *jobs.WebhookProvider:
		default:
			t.Errorf("provider %s is a %T outside the demo, want the configured provider itself", name, r.Provider)
		}
	}

	counts := newSentCounts()
	th, err = newThrottle(cfg, rdb, prometheus.NewRegistry(), log, io.Discard, counts)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range th.Providers {
		if _, ok := r.Provider.(jobs.ProviderFunc); !ok {
			t.Errorf("provider %s is a %T in the demo, want it wrapped by the send counter", name, r.Provider)
		}
	}
}
