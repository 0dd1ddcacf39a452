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
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/api"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/throttle"
)

// startAPI serves the HTTP API on api.addr until ctx ends and returns it
// and its base URL, or nil and "" without api.addr. Not being able to
// listen stops the worker: producers would find nothing there.
func startAPI(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger,
	events *lifecycle.Recorder) (*api.Server, string, error) {
	if cfg.API.Addr == "" {
		return nil, "", nil
	}
	lim, err := throttle.New(rdb, throttle.Options{Prefix: cfg.Redis.Prefix, Remember: cfg.Worker.RememberTakes})
	if err != nil {
		return nil, "", err
	}
	h, err := api.New(api.Options{Config: cfg, Redis: rdb, Limiter: lim, Metrics: reg, Log: log, Events: events})
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", cfg.API.Addr)
	if err != nil {
		return nil, "", fmt.Errorf("api.addr: %w", err)
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
	return h, url, nil
}

// reloadAPI gives the API the keys and names of a reloaded config (see
// api.Server.Reload); a change of api.addr waits for a restart.
func reloadAPI(srv *api.Server, cfg, old *config.Config, log *slog.Logger) {
	if srv == nil {
		return
	}
	if cfg.API.Addr != old.API.Addr {
		log.Warn("config reload: api.addr takes effect at the next start")
	}
	if err := srv.Reload(cfg); err != nil {
		log.Error("config reload: the API keeps its keys and names", "err", err)
		return
	}
	log.Info("api reloaded", "keys", len(cfg.API.Keys))
}

// runAPIOnly is -api-only: the HTTP API, /healthz and /metrics, and no
// worker, its config loaded as a producer's (config.LoadAPI).
func runAPIOnly(ctx context.Context, path string, stderr io.Writer) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cfg, err := config.LoadAPI(path, os.Getenv)
	if err != nil {
		return err
	}
	if cfg.API.Addr == "" {
		return errors.New("-api-only: the config has no api.addr to serve the API on")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	rdb, _, closeRedis, err := dial(ctx, cfg, log, redisconn.Connect) // embedded: a worker's, at redis.embedded_addr
	if err != nil {
		return err
	}
	defer closeRedis()
	reg := prometheus.NewRegistry()
	srv, _, err := startAPI(ctx, cfg, rdb, reg, log, lifecycle.NewRecorder(rdb, eventOptions(cfg, reg, log)))
	if err != nil {
		return err
	}
	if cfg.Worker.HTTPAddr != "" {
		if ln, err := net.Listen("tcp", cfg.Worker.HTTPAddr); err != nil {
			log.Warn("http server: not serving /healthz or /metrics", "addr", cfg.Worker.HTTPAddr, "err", err)
		} else {
			go serveHTTP(ctx, ln, nil, rdb, reg, log)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			reloadAPIOnly(path, srv, &cfg, stderr, log)
		}
	}
}

// reloadAPIOnly is -api-only's SIGHUP (see reloader.reload).
func reloadAPIOnly(path string, srv *api.Server, running **config.Config, stderr io.Writer, log *slog.Logger) {
	log.Info("SIGHUP: reloading the config", "file", path)
	cfg, err := config.LoadAPI(path, os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		log.Error("config reload refused: the running config stays", "file", path)
		return
	}
	reloadAPI(srv, cfg, *running, log)
	*running = cfg
}
