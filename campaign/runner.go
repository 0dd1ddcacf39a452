// Package campaign runs the config's campaigns: at every tick of a
// campaign's schedule, one notification per recipient of its audience,
// enqueued exactly once across the fleet, with no leader. How:
// docs/design.md#campaigns.
package campaign

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/lifecycle"
)

// TypeFanout is the asynq task type of a tick's fan-out. Its payload is the
// Tick as JSON: {"campaign": name, "tick": unix seconds}.
const TypeFanout = "campaign:fanout"

// Defaults of Options.
const (
	DefaultBatch = 500
	DefaultLease = 10 * time.Second
	DefaultWatch = 2 * time.Second
)

// fanoutRetries is the retry budget of a fan-out that fails (Redis or the
// audience file unavailable); each retry resumes from the checkpoint.
const fanoutRetries = 10

// Options tune a Runner; the zero value means the defaults.
type Options struct {
	Batch int // audience entries enqueued per round trip
	// Lease is how long a fan-out's worker may stay silent before another
	// worker resumes the fan-out.
	Lease time.Duration
	Watch time.Duration // how often a worker looks for fan-outs to resume
	Log   *slog.Logger  // default slog.Default()
	// Events records each notification's accepted event; default a
	// recorder of the config's events settings.
	Events *lifecycle.Recorder
}

// Runner runs a config's campaigns in one worker process: Run fires their
// ticks and resumes abandoned fan-outs; ProcessTask (the asynq.Handler of
// TypeFanout) fans a tick out. Safe for concurrent use.
type Runner struct {
	rdb       redis.UniversalClient
	client    *asynq.Client
	prefix    string
	shards    int // of each queue, where its campaigns' notifications go (asynqdb.ShardOf)
	campaigns map[string]*campaign
	names     []string // in config order
	opts      Options
	log       *slog.Logger

	resumes sync.Map       // Tick: the takeovers running in this process
	wg      sync.WaitGroup // the takeovers
	stop    chan struct{}  // closed when Run returns: fan-outs stop too
	stopped sync.Once
}

type campaign struct {
	config.Campaign
	schedule cron.Schedule
}

// keep is how long a tick's fan-out task and progress are kept: the ID must
// still conflict when a late or catching-up worker fires the tick again.
func (c *campaign) keep() time.Duration { return max(24*time.Hour, c.CatchUp+time.Hour) }

// New returns the Runner of cfg's campaigns on rdb, the Redis of the asynq
// queues. cfg must be valid (as Load returns it).
func New(cfg *config.Config, rdb redis.UniversalClient, opts Options) (*Runner, error) {
	if opts.Batch <= 0 {
		opts.Batch = DefaultBatch
	}
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.Watch <= 0 {
		opts.Watch = DefaultWatch
	}
	opts.Log = cmp.Or(opts.Log, slog.Default())
	if opts.Events == nil {
		opts.Events = lifecycle.NewRecorder(rdb, cfg.EventOptions())
	}
	cs, names, err := campaignsOf(cfg)
	if err != nil {
		return nil, err
	}
	return &Runner{
		rdb: rdb, client: asynq.NewClientFromRedisClient(rdb), prefix: cfg.Redis.Prefix, shards: max(cfg.Redis.Shards, 1),
		campaigns: cs, names: names, opts: opts, log: opts.Log, stop: make(chan struct{}),
	}, nil
}

// campaignsOf resolves cfg's campaigns (routes applied, schedules parsed),
// and their names in config order.
func campaignsOf(cfg *config.Config) (map[string]*campaign, []string, error) {
	cs := map[string]*campaign{}
	var names []string
	for _, cp := range cfg.Campaigns {
		s, err := cp.Schedule()
		if err != nil {
			return nil, nil, fmt.Errorf("campaign %s: schedule %q: %w", cp.Name, cp.Cron, err)
		}
		r := cp.Route(cfg)
		cp.Policy, cp.Provider, cp.Queue = r.Policy, r.Provider, r.Queue
		cs[cp.Name] = &campaign{Campaign: cp, schedule: s}
		names = append(names, cp.Name)
	}
	return cs, names, nil
}

// Run catches up missed ticks, then fires the campaigns' ticks and resumes
// abandoned fan-outs until ctx ends. Then every fan-out of the Runner,
// ProcessTask's included, stops after its batch and hands its lease over;
// Run returns when the fan-outs it resumed have stopped. Run it once in
// every worker, and end it before shutting the asynq server down.
func (r *Runner) Run(ctx context.Context) error {
	stop := func() { r.stopped.Do(func() { close(r.stop) }) }
	defer stop()
	context.AfterFunc(ctx, stop)
	var wg sync.WaitGroup
	for _, name := range r.names {
		wg.Go(func() { r.schedule(ctx, r.campaigns[name]) })
	}
	if len(r.names) > 0 {
		wg.Go(func() { r.watch(ctx) })
	}
	wg.Wait()
	r.wg.Wait()
	return nil
}

// shardsOf returns the asynq queues that hold the notifications of queue's
// campaigns.
func (r *Runner) shardsOf(queue string) []string {
	shards := make([]string, r.shards)
	for i := range shards {
		shards[i] = asynqdb.Shard(queue, i, r.shards)
	}
	return shards
}

// forget deletes keys that expire anyway: a failure is only logged.
func (r *Runner) forget(ctx context.Context, keys []string) {
	for _, k := range keys {
		if err := r.rdb.Del(ctx, k).Err(); err != nil {
			r.log.Warn("campaign: delete a finished fan-out's key (it expires)", "key", k, "err", err)
			return
		}
	}
}

// queues returns the queues of the campaigns, sorted.
func (r *Runner) queues() []string {
	var qs []string
	for _, c := range r.campaigns {
		qs = append(qs, c.Queue)
	}
	slices.Sort(qs)
	return slices.Compact(qs)
}

// bind returns ctx, also canceled when the Runner stops.
func (r *Runner) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
