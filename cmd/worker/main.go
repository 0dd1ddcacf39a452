// Command worker delivers notification jobs through the throttle, runs the
// config's campaigns and, with api.addr, serves the HTTP API. Its usage is
// what -h prints (usage, below); docs/design.md#the-worker describes it and
// docs/operations.md runs it. make release names the binary throttler-worker;
// go build names it worker.
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
	"sync/atomic"
	"syscall"
	"time"
	_ "time/tzdata" // time zones also on hosts without zoneinfo files

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/dashboard"
	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/fleet"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/buildinfo"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redisguard"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/screen"
	"github.com/notify-throttle/throttler/throttle"
)

// name is the release binary's name, for -version; messages say "worker:".
const name = "throttler-worker"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitStatus(err, os.Stderr))
}

// Exit statuses, as usage tells them.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError is a mistake on the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// exitStatus writes err to stderr once, unless it was reported already, and
// returns the exit status it calls for.
func exitStatus(err error, stderr io.Writer) int {
	var usage *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "worker: %s\nRun 'worker -h' for usage.\n", usage.msg)
		return exitUsage
	case errors.Is(err, errReported):
	default:
		fmt.Fprintln(stderr, "worker:", err)
	}
	return exitError
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseFlags(args, stdout)
	if err != nil {
		return err
	}
	switch {
	case f.version:
		fmt.Fprintln(stdout, name, buildinfo.Read())
		return nil
	case f.check:
		return check(ctx, f.path, f.connect, stdout, stderr)
	case f.apiOnly:
		return runAPIOnly(ctx, f.path, stderr)
	}
	return work(ctx, f, stdout, stderr)
}

type flags struct {
	path                             string
	demo                             time.Duration
	check, connect, apiOnly, version bool
}

// parseFlags reads the command line: -h prints the usage on stdout and
// returns flag.ErrHelp; a mistake is a *usageError.
func parseFlags(args []string, stdout io.Writer) (*flags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once by exitStatus, -h on stdout
	f := &flags{}
	fs.StringVar(&f.path, "config", "config.yaml", "the config file")
	fs.DurationVar(&f.demo, "demo", 0, "enqueue a demo burst, run this long, print a summary per recipient and exit")
	fs.BoolVar(&f.check, "check", false, "check the config as a start would, connect to nothing, and exit: 0 and a summary, or 1 and every mistake")
	fs.BoolVar(&f.connect, "connect", false, "with -check: also connect to Redis (login, TLS, cluster) and say what answered")
	fs.BoolVar(&f.apiOnly, "api-only", false, "serve the HTTP API on api.addr (and /healthz, /metrics on worker.http_addr) and deliver nothing; the providers' secrets are not needed")
	fs.BoolVar(&f.version, "version", false, "print the version and the commit it was built from, and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprint(stdout, usage)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q: flags come first, values need their flag", fs.Arg(0))}
	}
	if f.connect && !f.check {
		return nil, &usageError{msg: "-connect goes with -check"}
	}
	return f, nil
}

// usage is what -h prints before the flags.
const usage = "Usage: worker [-config config.yaml] [-demo 20s]\n" +
	"       worker -check [-connect] [-config config.yaml]\n" +
	"       worker -api-only [-config config.yaml]\n" +
	"       worker -version\n\n" +
	"Delivers notification jobs through the recipient policies and provider buckets in the config.\n" +
	"REDIS_URL overrides redis.url and REDIS_PASSWORD redis.password; a secret in the config (a\n" +
	"webhook header or URL, the Redis password or URL) may be {env: NAME} or {file: PATH} instead\n" +
	"of the value. SIGINT/SIGTERM stop it gracefully; SIGHUP reloads the policies, providers and API keys.\n\n" +
	"worker.http_addr (default 127.0.0.1:9464) serves /healthz, /metrics and the dashboard:\n" +
	"/throttle (providers, policies, a recipient's windows, campaigns; JSON under /throttle/api/)\n" +
	"and /monitoring/ (asynq's queues and tasks), behind worker.dashboard's auth.\n" +
	"api.addr (default off) serves the HTTP API for producers, with api.keys; -api-only serves it\n" +
	"alone, delivering nothing and needing none of the providers' secrets.\n\n" +
	"-check validates everything a start does (settings, secret references, audience files,\n" +
	"schedules) without connecting, prints \"FILE: ok: ...\" and exits 0, or prints every mistake\n" +
	"as FILE:LINE: PATH: MESSAGE and exits 1. -check -connect also logs in to Redis.\n\nExamples:\n" +
	"  worker                       # config.yaml (embedded Redis: for trying things out)\n" +
	"  REDIS_URL=redis://127.0.0.1:6379/0 worker -config prod.yaml\n" +
	"  worker -check -config prod.yaml           # in CI, before a deploy\n" +
	"  worker -check -connect -config prod.yaml  # on the host, with its secrets\n" +
	"  worker -demo 20s             # what `make demo` runs\n\n" +
	"Exit status: 0 done, 1 an error stopped it (or -check found mistakes), 2 a mistake on the\n" +
	"command line.\n\nFlags:\n"

// work runs the worker until ctx ends (or, with -demo, the demo does).
func work(ctx context.Context, f *flags, stdout, stderr io.Writer) error {
	// SIGHUP reloads the config (reloader), caught from here on so that
	// one sent while the worker starts does not end it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cfg, err := config.Load(f.path)
	if err != nil {
		return err
	}
	counts := demoSetup(cfg, f.demo, stdout)
	ln, secret, err := openHTTP(cfg)
	if err != nil {
		return err
	}
	serving := false // from then on the HTTP server closes ln when ctx ends
	defer func() {
		if ln != nil && !serving {
			ln.Close()
		}
	}()
	log := newLogger(cfg.Log, stderr)
	rdb, guard, closeRedis, err := connect(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()

	reg := prometheus.NewRegistry()
	processMetrics(reg)
	evo := eventOptions(cfg, reg, log)
	events := lifecycle.NewRecorder(rdb, evo)
	served, err := servedQueues(ctx, cfg, rdb)
	if err != nil {
		return err
	}
	th, built, rec, err := handlers(cfg, served, rdb, reg, log, stdout, counts)
	if err != nil {
		return err
	}
	stopping := make(chan struct{})
	th.Stopping, th.Events = stopping, events
	srv := newServer(cfg, served, rdb, newOutcomes(log), guard.AsynqLogger())
	campaigns, err := campaign.New(cfg, rdb, campaign.Options{Log: log, Events: events})
	if err != nil {
		return err
	}
	mux := newMux(rec, th, campaigns)
	// The fleet runs until the asynq server has shut down: a worker whose
	// handlers still run must not be taken for dead.
	stopFleet := background(context.WithoutCancel(ctx), func(ctx context.Context) { _ = rec.Run(ctx) })
	defer stopFleet()
	// The dashboard's counts of sends, written once a second, and the last
	// ones after the server has shut down.
	defer background(context.WithoutCancel(ctx), th.Limiter.CountSends)()
	// Waiting work laid at another rate or weights than the config's is
	// re-paced first (docs/booking.md#re-pacing-when-the-rules-change).
	queues := asynqdb.Names(served)
	repace(ctx, th, rdb, queues, log)
	reweigh(ctx, th, rdb, queues, log)
	apiSrv, apiURL, err := startAPI(ctx, cfg, rdb, reg, log, events)
	if err != nil {
		return err
	}
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	// running is the config in effect, replaced by every reload.
	running := &atomic.Pointer[config.Config]{}
	running.Store(cfg)
	if ln != nil {
		serving = true
		startHTTP(ctx, ln, newDashboard(running, secret, rdb, reg, campaigns), cfg, f.demo > 0, rdb, reg, log, stdout)
	}
	go jobs.WatchClock(ctx, rdb, th.Metrics, log)
	stopCampaigns := background(ctx, func(ctx context.Context) { _ = campaigns.Run(ctx) })
	stopCallbacks := func() {}
	if len(evo.Callbacks) > 0 { // the tenants' status callbacks
		stopCallbacks = background(context.WithoutCancel(ctx), lifecycle.NewDispatcher(rdb, evo).Run)
	}
	rl := &reloader{path: f.path, running: running, senders: built, th: th, stdout: stdout, stderr: stderr, log: log, counts: counts,
		reloads: newReloads(reg), rdb: rdb, api: apiSrv, queues: queues}
	go rl.run(ctx, hup)
	log.Info("worker started", "concurrency", cfg.Worker.Concurrency, "queues", served, "campaigns", len(cfg.Campaigns))

	if f.demo > 0 {
		err = runDemo(ctx, cfg, rdb, f.demo, counts, stdout, apiURL)
	} else {
		<-ctx.Done()
	}
	log.Info("shutting down", "timeout", cfg.Worker.ShutdownTimeout)
	close(stopping)
	stopCampaigns()
	srv.Shutdown()
	stopCallbacks()
	return err // the deferred stopFleet then leaves the fleet's beats
}

// openHTTP reads the dashboard's secret and opens worker.http_addr (nil if
// none) before anything connects: a worker without the secret, or that
// cannot serve /healthz and /metrics, stops at once saying why.
func openHTTP(cfg *config.Config) (net.Listener, string, error) {
	secret, err := cfg.Worker.Dashboard.Secret(os.Getenv)
	if err != nil || cfg.Worker.HTTPAddr == "" {
		return nil, secret, err
	}
	ln, err := net.Listen("tcp", cfg.Worker.HTTPAddr)
	if err != nil {
		return nil, "", fmt.Errorf("worker.http_addr: cannot serve /healthz, /metrics and the dashboard on %s: %w", cfg.Worker.HTTPAddr, err)
	}
	return ln, secret, nil
}

// demoSetup makes cfg the demo's, with -demo (d > 0), and returns the
// demo's count of sends; nil without.
func demoSetup(cfg *config.Config, d time.Duration, out io.Writer) *sentCounts {
	if d <= 0 {
		return nil
	}
	demoRules(cfg)
	demoAPI(cfg)
	counts := newSentCounts()
	counts.callbacks = demoCallbacks(cfg)
	demoAddrs(cfg, out)
	return counts
}

// connect logs the config's warnings and connects to Redis, serving the
// embedded one if the config says so.
func connect(ctx context.Context, cfg *config.Config, log *slog.Logger) (redis.UniversalClient, *redisguard.Guard, func() error, error) {
	for _, w := range append(cfg.Warnings(), cfg.Redis.Warnings()...) {
		log.Warn(w)
	}
	rdb, guard, closeRedis, err := dial(ctx, cfg, log, redisconn.Serve)
	if err != nil {
		return nil, nil, nil, err
	}
	if cfg.Redis.IsEmbedded() {
		log.Warn("EMBEDDED REDIS: an in-process server for trying things out; nothing persists and other workers cannot share it",
			"addr", cfg.Redis.EmbeddedAddr)
	} else {
		log.Info("redis", "at", cfg.Redis.String())
	}
	return rdb, guard, closeRedis, nil
}

// dial connects to Redis with open through a guard (internal/redisguard)
// and resolves the queues' shards as every process does.
func dial(ctx context.Context, cfg *config.Config, log *slog.Logger,
	open func(context.Context, redisconn.Config) (redis.UniversalClient, func() error, error)) (redis.UniversalClient, *redisguard.Guard, func() error, error) {
	guard := redisguard.New(log, redisguard.Options{})
	redis.SetLogger(guard.RedisLogger())
	rdb, closeRedis, err := guard.Connect(ctx, func(ctx context.Context) (redis.UniversalClient, func() error, error) {
		return open(ctx, cfg.Redis)
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if cfg.Redis.Shards, err = redisconn.Shards(ctx, cfg.Redis, rdb); err != nil {
		closeRedis()
		return nil, nil, nil, err
	}
	return rdb, guard, closeRedis, nil
}

// handlers builds the notification handler and this worker's member of
// the fleet (docs/design.md#dead-workers); worker.dead_after 0 hands
// nothing over.
func handlers(cfg *config.Config, served map[string]int, rdb redis.UniversalClient, reg *prometheus.Registry, log *slog.Logger,
	stdout io.Writer, counts *sentCounts) (*jobs.Throttle, senders, *fleet.Member, error) {
	th, built, err := newThrottle(cfg, rdb, reg, log, stdout, counts)
	if err != nil {
		return nil, nil, nil, err
	}
	if counts != nil {
		th.OnBooked = counts.booked
	}
	deadAfter := cfg.Worker.DeadAfter
	if deadAfter == 0 {
		deadAfter = -1 // no hand-over
	}
	member := fleet.New(rdb, asynqdb.Names(served), fleet.Options{DeadAfter: deadAfter,
		Lead: fleet.WakeLead(cfg.Worker.PollInterval), Prefix: cfg.Redis.Prefix, Log: log, Metrics: fleet.NewMetrics(reg)})
	th.Fleet = member
	return th, built, member, nil
}

// newMux routes the worker's task types to their handlers, each task held
// by rec while it runs.
func newMux(rec *fleet.Member, th *jobs.Throttle, campaigns *campaign.Runner) *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Use(rec.Middleware)
	mux.Handle(message.TaskType, th)
	mux.Handle(digest.TaskType, th)
	mux.Handle(campaign.TypeFanout, campaigns)
	return mux
}

// background runs f until ctx ends or stop is called, which waits for it.
func background(ctx context.Context, f func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	return func() { cancel(); <-done }
}

// startHTTP serves /healthz, /metrics and the dashboard (dash, nil if off)
// on ln until ctx ends, and says where.
func startHTTP(ctx context.Context, ln net.Listener, dash http.Handler, cfg *config.Config, demo bool,
	rdb redis.UniversalClient, reg *prometheus.Registry, log *slog.Logger, stdout io.Writer) {
	base := "http://" + ln.Addr().String()
	if dash != nil {
		log.Info("dashboard", "throttle", base+"/throttle", "queues", base+"/monitoring/", "auth", cmp.Or(cfg.Worker.Dashboard.Auth, "none"))
		if demo {
			fmt.Fprintf(stdout, "demo: dashboard at %s/throttle (a recipient: %s/throttle?recipient=alice@example.com) and %s/monitoring/ while the demo runs\n", base, base, base)
		}
	}
	go serveHTTP(ctx, ln, dash, rdb, reg, log)
}

// servedQueues returns the asynq queues the worker serves, with their
// priorities (asynqdb.Served).
func servedQueues(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient) (map[string]int, error) {
	known, err := rdb.SMembers(ctx, asynqdb.AllQueues).Result()
	if err != nil {
		return nil, fmt.Errorf("list asynq's queues: %w", err)
	}
	return asynqdb.Served(cfg.Worker.Queues, cfg.Redis.Shards, known), nil
}

// newServer returns the asynq server of the worker's handlers: outs logs
// the outcomes the handlers do not, and filters asynq's lines in base.
func newServer(cfg *config.Config, served map[string]int, rdb redis.UniversalClient, outs *outcomes, base asynq.Logger) *asynq.Server {
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              cfg.Worker.Concurrency,
		Queues:                   served,
		ShutdownTimeout:          cfg.Worker.ShutdownTimeout,
		TaskCheckInterval:        cfg.Worker.PollInterval,
		IsFailure:                jobs.IsFailure,
		RetryDelayFunc:           jobs.RetryDelay(cfg.Worker.Jitter),
		DelayedTaskCheckInterval: time.Second,
		LogLevel:                 asynq.WarnLevel,
		Logger:                   &filteredLogger{Logger: base, o: outs},
		ErrorHandler:             asynq.ErrorHandlerFunc(outs.handleError),
	})
}

// newThrottle builds the notification handler from the config, counting
// sends per recipient with the demo's counts.
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
		Limiter: lim, Rules: rules, Sent: sentMarks(cfg, lim), Screen: screen.New(rdb, cfg.Redis.Prefix),
		Digests: digest.New(rdb, cfg.Redis.Prefix, asynq.NewClientFromRedisClient(rdb)),
		Pacing: jobs.Pacing{InlineWait: cfg.Worker.InlineWait, LateAfter: cfg.Worker.WindowMargin / 2, Book: cfg.Worker.Book,
			BookAhead: cfg.Worker.BookAhead, PriorityQueues: priority(cfg)},
		Metrics: jobs.NewMetrics(reg), Log: log,
	}, built, nil
}

// priority returns the set of worker.priority_queues.
func priority(cfg *config.Config) map[string]bool {
	m := make(map[string]bool, len(cfg.Worker.PriorityQueues))
	for _, q := range cfg.Worker.PriorityQueues {
		m[q] = true
	}
	return m
}

// sentMarks returns the sent markers the config asks for, nil when off.
func sentMarks(cfg *config.Config, lim *throttle.Limiter) *jobs.SentMarks {
	if cfg.Worker.SentMarks <= 0 {
		return nil
	}
	s := jobs.NewSentMarks(lim)
	s.TTL = cfg.Worker.SentMarks
	return s
}

// output opens a log provider's output.
func output(name string, stdout io.Writer) (io.Writer, error) {
	switch name {
	case "", "stdout":
		return stdout, nil
	case "stderr":
		return os.Stderr, nil
	}
	return os.OpenFile(name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
}

// serveHTTP serves /healthz (Redis reachable), /metrics and the dashboard
// (dash, nil if off) on ln until ctx ends.
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

// newDashboard builds the dashboard the config asks for, with its secret;
// nil when worker.dashboard turns it off.
func newDashboard(running *atomic.Pointer[config.Config], secret string, rdb redis.UniversalClient, reg *prometheus.Registry, campaigns *campaign.Runner) http.Handler {
	cfg := running.Load()
	if !cfg.Worker.Dashboard.Enabled {
		return nil
	}
	return dashboard.New(dashboard.Options{Redis: rdb, Config: cfg, Current: running.Load, Secret: secret, Campaigns: campaigns, Metrics: reg,
		Suppressions: suppressions{screen: screen.New(rdb, cfg.Redis.Prefix), running: running}})
}

// suppressions tells the dashboard whether any provider of the running
// config suppressed a recipient (screen.Screen).
type suppressions struct {
	screen  *screen.Screen
	running *atomic.Pointer[config.Config]
}

func (s suppressions) Suppressed(ctx context.Context, recipient string) (dashboard.Suppression, bool, error) {
	for _, name := range slices.Sorted(maps.Keys(s.running.Load().Providers)) {
		sup, _, err := s.screen.Check(ctx, name, recipient, nil)
		if err != nil {
			return dashboard.Suppression{}, false, err
		}
		if sup != nil {
			return dashboard.Suppression{Reason: "provider " + name + ": " + sup.Reason}, true, nil
		}
	}
	return dashboard.Suppression{}, false, nil
}
