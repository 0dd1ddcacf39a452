package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/api"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redisguard"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/throttle"
)

// startAPI serves the HTTP API (package api) on api.addr until ctx ends and
// returns its base URL, or "" when the config has no api.addr. The API has
// a listener of its own, apart from worker.http_addr: other services reach
// it with API keys, while http_addr is the operators' (loopback or
// dashboard auth), so each is exposed and guarded on its own. Not being
// able to listen stops the worker: producers would find nothing there.
func startAPI(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger,
	events *lifecycle.Recorder) (string, error) {
	if cfg.API.Addr == "" {
		return "", nil
	}
	lim, err := throttle.New(rdb, throttle.Options{Prefix: cfg.Redis.Prefix, Remember: cfg.Worker.RememberTakes})
	if err != nil {
		return "", err
	}
	h, err := api.New(api.Options{Config: cfg, Redis: rdb, Limiter: lim, Metrics: reg, Log: log, Events: events})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", cfg.API.Addr)
	if err != nil {
		return "", fmt.Errorf("api.addr: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	go func() { <-ctx.Done(); _ = hs.Close() }()
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("api server", "addr", ln.Addr().String(), "err", err)
		}
	}()
	url := "http://" + ln.Addr().String()
	log.Info("api", "url", url+"/v1/notifications", "keys", len(cfg.API.Keys))
	return url, nil
}

// runAPIOnly is -api-only: the HTTP API, /healthz and /metrics, and no
// worker. It loads the config as a producer (config.LoadAPI): the
// providers' secrets need not be on its host.
func runAPIOnly(ctx context.Context, path string, stderr io.Writer) error {
	cfg, err := config.LoadAPI(path, os.Getenv)
	if err != nil {
		return err
	}
	if cfg.API.Addr == "" {
		return errors.New("-api-only: the config has no api.addr to serve the API on")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	guard := redisguard.New(log, redisguard.Options{})
	redis.SetLogger(guard.RedisLogger())
	rdb, closeRedis, err := guard.Connect(ctx, func(ctx context.Context) (redis.UniversalClient, func() error, error) {
		return redisconn.Connect(ctx, cfg.Redis) // embedded: a worker's, at redis.embedded_addr
	})
	if err != nil {
		return err
	}
	defer closeRedis()
	reg := prometheus.NewRegistry()
	if _, err := startAPI(ctx, cfg, rdb, reg, log, lifecycle.NewRecorder(rdb, eventOptions(cfg, reg, log))); err != nil {
		return err
	}
	if cfg.Worker.HTTPAddr != "" {
		if ln, err := net.Listen("tcp", cfg.Worker.HTTPAddr); err != nil {
			log.Warn("http server: not serving /healthz or /metrics", "addr", cfg.Worker.HTTPAddr, "err", err)
		} else {
			go serveHTTP(ctx, ln, nil, rdb, reg, log)
		}
	}
	<-ctx.Done()
	return nil
}
