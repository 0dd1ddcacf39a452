// Command worker delivers notification jobs through the throttle: every job
// is admitted by the Redis scripts (recipient policy and provider bucket) and
// then sent, paced inline, or deferred by exactly the delay the script gave.
// It also runs the config's campaigns (package campaign): every worker fires
// their ticks, and each tick fans out once for the whole fleet.
//
// Usage:
//
//	worker [-config config.yaml] [-demo 20s]
//	worker -check [-connect] [-config config.yaml]
//
// With the default config (redis.url: embedded) it runs on an in-process
// Redis for trying things out; -demo also enqueues a burst of notifications
// for a few recipients and prints a summary per recipient before it exits.
//
// -check loads the config as a start would (every setting, secret reference,
// audience file and schedule), connects to nothing, and exits 0 after a
// one-line summary or 1 after listing every mistake; -check -connect also
// logs in to Redis and says what answered. Deploy pipelines run it first.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
	_ "time/tzdata" // time zones also on hosts without zoneinfo files

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/dashboard"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redisguard"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/recovery"
	"github.com/notify-throttle/throttler/throttle"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage was the answer
	}
	if errors.Is(err, errReported) {
		os.Exit(1)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "the config file")
	demo := fs.Duration("demo", 0, "enqueue a demo burst, run this long, print a summary per recipient and exit")
	checkOnly := fs.Bool("check", false, "check the config as a start would, connect to nothing, and exit: 0 and a summary, or 1 and every mistake")
	connect := fs.Bool("connect", false, "with -check: also connect to Redis (login, TLS, cluster) and say what answered")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: worker [-config config.yaml] [-demo 20s]\n"+
			"       worker -check [-connect] [-config config.yaml]\n\n"+
			"Delivers notification jobs through the recipient policies and provider buckets in the config.\n"+
			"REDIS_URL overrides redis.url and REDIS_PASSWORD redis.password; a secret in the config (a\n"+
			"webhook header or URL, the Redis password or URL) may be {env: NAME} or {file: PATH} instead\n"+
			"of the value. SIGINT/SIGTERM stop it gracefully; SIGHUP reloads the policies and providers.\n\n"+
			"worker.http_addr (default 127.0.0.1:9464) serves /healthz, /metrics and the dashboard:\n"+
			"/throttle (providers, policies, a recipient's windows, campaigns; JSON under /throttle/api/)\n"+
			"and /monitoring/ (asynq's queues and tasks), behind worker.dashboard's auth.\n\n"+
			"-check validates everything a start does (settings, secret references, audience files,\n"+
			"schedules) without connecting, prints \"FILE: ok: ...\" and exits 0, or prints every mistake\n"+
			"as FILE:LINE: PATH: MESSAGE and exits 1. -check -connect also logs in to Redis.\n\nExamples:\n"+
			"  worker                       # config.yaml (embedded Redis: for trying things out)\n"+
			"  REDIS_URL=redis://127.0.0.1:6379/0 worker -config prod.yaml\n"+
			"  worker -check -config prod.yaml           # in CI, before a deploy\n"+
			"  worker -check -connect -config prod.yaml  # on the host, with its secrets\n"+
			"  worker -demo 20s             # what `make demo` runs\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *connect && !*checkOnly {
		fmt.Fprintln(stderr, "worker: -connect goes with -check")
		return errReported
	}
	if *checkOnly {
		return check(ctx, *path, *connect, stdout, stderr)
	}
	// SIGHUP reloads the config (see reloader); caught from here on, so
	// that one sent while the worker starts does not end it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	// The dashboard's secret is read before anything starts: a worker
	// missing it stops at once, naming the variable.
	secret, err := cfg.Worker.Dashboard.Secret(os.Getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	for _, w := range append(cfg.Warnings(), cfg.Redis.Warnings()...) {
		log.Warn(w)
	}
	// The guard makes calls that find Redis unreachable back off (asynq's
	// dequeue loop would otherwise spin), logs an outage at a bounded rate,
	// and waits for Redis at start-up instead of exiting.
	guard := redisguard.New(log, redisguard.Options{})
	redis.SetLogger(guard.RedisLogger())
	rdb, closeRedis, err := guard.Connect(ctx, func(ctx context.Context) (redis.UniversalClient, func() error, error) {
		return redisconn.Serve(ctx, cfg.Redis)
	})
	if err != nil {
		return err
	}
	defer closeRedis()
	if cfg.Redis.IsEmbedded() {
		log.Warn("EMBEDDED REDIS: an in-process server for trying things out; nothing persists and other workers cannot share it",
			"addr", cfg.Redis.EmbeddedAddr)
	} else {
		log.Info("redis", "at", cfg.Redis.String())
	}

	reg := prometheus.NewRegistry()
	var counts *sentCounts
	if *demo > 0 {
		counts = newSentCounts()
		demoRules(cfg)
	}
	th, built, err := newThrottle(cfg, rdb, reg, log, stdout, counts)
	if err != nil {
		return err
	}
	if counts != nil {
		th.OnBooked = counts.booked
	}
	stopping := make(chan struct{})
	th.Stopping = stopping
	// Recovery: this worker's signs of life, the tasks it holds, and the
	// reaper that hands a dead worker's tasks to the fleet. It runs until
	// the asynq server has shut down: a worker whose handlers still run
	// must not be taken for dead.
	var rec *recovery.Recovery
	if cfg.Worker.DeadAfter > 0 {
		rec = recovery.New(rdb, slices.Sorted(maps.Keys(cfg.Queues())), recovery.Options{
			DeadAfter: cfg.Worker.DeadAfter, Prefix: cfg.Redis.Prefix, Log: log, Metrics: recovery.NewMetrics(reg)})
		th.Holder = rec
	}

	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              cfg.Worker.Concurrency,
		Queues:                   cfg.Queues(),
		ShutdownTimeout:          cfg.Worker.ShutdownTimeout,
		TaskCheckInterval:        cfg.Worker.PollInterval,
		IsFailure:                jobs.IsFailure,
		RetryDelayFunc:           jobs.RetryDelay(cfg.Worker.Jitter),
		DelayedTaskCheckInterval: time.Second,
		LogLevel:                 asynq.WarnLevel,
		Logger:                   guard.AsynqLogger(),
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			id, _ := asynq.GetTaskID(ctx)
			var d *jobs.Deferral
			if errors.As(err, &d) {
				// A booking is summed up per rule by the throttle's log: a
				// backlog books thousands a second. A deferral without
				// booking (book off, a cluster) is logged with its reason.
				if !d.Booked {
					log.Info("deferred", "task", id, "reason", d.Error())
				}
				return
			}
			log.Warn("job failed", "task", id, "err", err)
		}),
	})
	campaigns, err := campaign.New(cfg, rdb, campaign.Options{Log: log})
	if err != nil {
		return err
	}
	mux := asynq.NewServeMux()
	if rec != nil {
		mux.Use(rec.Middleware)
	}
	mux.Handle(jobs.TypeNotify, th)
	mux.Handle(jobs.TypeDigest, th)
	mux.Handle(campaign.TypeFanout, campaigns)
	recoveryCtx, stopRecovery := context.WithCancel(context.WithoutCancel(ctx))
	recoveryDone := make(chan struct{})
	go func() {
		defer close(recoveryDone)
		if rec != nil {
			_ = rec.Run(recoveryCtx)
		}
	}()
	defer func() { stopRecovery(); <-recoveryDone }()
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if cfg.Worker.HTTPAddr != "" {
		if ln, dash := listenHTTP(cfg, secret, rdb, reg, campaigns, log); ln != nil {
			base := "http://" + ln.Addr().String()
			if dash != nil {
				log.Info("dashboard", "throttle", base+"/throttle", "queues", base+"/monitoring/", "auth", cmp.Or(cfg.Worker.Dashboard.Auth, "none"))
				if *demo > 0 {
					fmt.Fprintf(stdout, "demo: dashboard at %s/throttle (a recipient: %s/throttle?recipient=alice@example.com) and %s/monitoring/ while the demo runs\n", base, base, base)
				}
			}
			go serveHTTP(ctx, ln, dash, rdb, reg, log)
		}
	}
	go jobs.WatchClock(ctx, rdb, th.Metrics, log)
	// Every worker runs the campaign schedules: the fan-out task IDs make
	// one fan-out per tick for the fleet.
	campaignCtx, stopCampaigns := context.WithCancel(ctx)
	campaignsDone := make(chan struct{})
	go func() {
		defer close(campaignsDone)
		_ = campaigns.Run(campaignCtx)
	}()
	rl := &reloader{path: *path, running: cfg, senders: built, th: th, stdout: stdout, stderr: stderr, log: log, counts: counts}
	go rl.run(ctx, hup)
	log.Info("worker started", "concurrency", cfg.Worker.Concurrency, "queues", cfg.Queues(), "campaigns", len(cfg.Campaigns))

	if *demo > 0 {
		err = runDemo(ctx, cfg, rdb, *demo, counts, stdout)
	} else {
		<-ctx.Done()
	}
	log.Info("shutting down", "timeout", cfg.Worker.ShutdownTimeout)
	close(stopping)
	stopCampaigns() // fan-outs stop after their batch and hand their lease over
	<-campaignsDone
	srv.Shutdown()
	return err // the deferred stopRecovery then leaves the fleet's beats
}

// newThrottle builds the notification handler from the config: rules, providers,
// metrics. With counts (the demo's), every provider's accepted sends are
// counted per recipient; without, providers are used as they are: a count
// per recipient held for the life of a production worker would grow with
// every recipient it ever delivered to.
func newThrottle(cfg *config.Config, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger, stdout io.Writer, counts *sentCounts) (*jobs.Throttle, senders, error) {
	lim, err := throttle.New(rdb, throttle.Options{Prefix: cfg.Redis.Prefix, Remember: cfg.Worker.RememberTakes})
	if err != nil {
		return nil, nil, err
	}
	rules, built, err := buildRules(cfg, stdout, counts, nil)
	if err != nil {
		return nil, nil, err
	}
	return &jobs.Throttle{
		Limiter: lim, Policies: rules.Policies, Providers: rules.Providers, Settings: rules.Settings,
		Weights: rules.Weights, Sent: sentMarks(cfg, rdb), Screen: jobs.NewScreen(rdb, cfg.Redis.Prefix),
		Digests:    jobs.NewDigests(rdb, cfg.Redis.Prefix, asynq.NewClientFromRedisClient(rdb)),
		InlineWait: cfg.Worker.InlineWait, Book: cfg.Worker.Book, BookAhead: cfg.Worker.BookAhead, PriorityQueues: priority(cfg),
		Metrics: jobs.NewMetrics(reg), Log: log,
	}, built, nil
}

// priority returns the set of priority queues.
func priority(cfg *config.Config) map[string]bool {
	m := make(map[string]bool, len(cfg.Worker.PriorityQueues))
	for _, q := range cfg.Worker.PriorityQueues {
		m[q] = true
	}
	return m
}

// sentMarks returns the sent markers the config asks for, nil when off.
func sentMarks(cfg *config.Config, rdb redis.UniversalClient) *jobs.SentMarks {
	if cfg.Worker.SentMarks <= 0 {
		return nil
	}
	s := jobs.NewSentMarks(rdb, cfg.Redis.Prefix)
	s.TTL = cfg.Worker.SentMarks
	return s
}

func output(name string, stdout io.Writer) (io.Writer, error) {
	switch name {
	case "", "stdout":
		return stdout, nil
	case "stderr":
		return os.Stderr, nil
	}
	return os.OpenFile(name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
}

// serveHTTP serves /healthz (Redis reachable), /metrics and, unless the
// config turns it off, the dashboard (/throttle and /monitoring/) on ln
// until ctx ends.
func serveHTTP(ctx context.Context, ln net.Listener, dash http.Handler, rdb redis.UniversalClient, reg *prometheus.Registry, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.Ping(r.Context()).Err(); err != nil {
			http.Error(w, "redis unreachable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if dash != nil {
		for _, p := range dashboard.Paths {
			mux.Handle(p, dash)
		}
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = hs.Close() }()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http server", "addr", ln.Addr().String(), "err", err)
	}
}

// listenHTTP opens the worker's HTTP address and builds the dashboard the
// config asks for, with its secret. An address that cannot be listened on
// is logged, and the worker runs without it, as it always has.
func listenHTTP(cfg *config.Config, secret string, rdb redis.UniversalClient, reg *prometheus.Registry, campaigns *campaign.Runner, log *slog.Logger) (net.Listener, http.Handler) {
	var dash http.Handler
	if cfg.Worker.Dashboard.Enabled {
		dash = dashboard.New(dashboard.Options{Redis: rdb, Config: cfg, Secret: secret, Campaigns: campaigns, Metrics: reg})
	}
	ln, err := net.Listen("tcp", cfg.Worker.HTTPAddr)
	if err != nil {
		log.Warn("http server: not serving /healthz, /metrics or the dashboard", "addr", cfg.Worker.HTTPAddr, "err", err)
		return nil, nil
	}
	return ln, dash
}
