package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/api"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/providers"
)

// senders are the providers' senders a worker built, by provider, with the
// settings each was built from, so that a reload keeps those it can.
type senders map[string]sender

type sender struct {
	cfg config.Provider
	p   providers.Provider
}

// buildRules builds the throttle's rules from cfg: a quota per policy with
// its settings, a bucket and a sender per provider. A provider whose sender
// settings are those it had in keep keeps its sender (open file, connections).
func buildRules(cfg *config.Config, stdout io.Writer, counts *sentCounts, keep senders) (jobs.Rules, senders, error) {
	policies, buckets, err := cfg.Rules()
	if err != nil {
		return jobs.Rules{}, nil, err
	}
	rules := jobs.Rules{Policies: policies, Providers: map[string]jobs.Route{}, Settings: map[string]jobs.PolicySettings{},
		Weights: cfg.Tenants.Weights}
	built := senders{}
	for name, p := range cfg.Providers {
		s, ok := keep[name]
		if !ok || !sameSender(s.cfg, p) {
			prov, err := newSender(name, p, stdout)
			if err != nil {
				return jobs.Rules{}, nil, err
			}
			if counts != nil {
				prov = counts.wrap(prov)
			}
			prov = addressed(p.Type, prov)
			s = sender{p: prov}
		}
		s.cfg = p
		built[name] = s
		rules.Providers[name] = jobs.Route{Bucket: buckets[name], Provider: s.p, Shadow: p.Shadow}
	}
	for name, p := range cfg.Policies {
		cals, quiet, zone, err := cfg.Local(name)
		if err != nil {
			return jobs.Rules{}, nil, err
		}
		s := jobs.PolicySettings{Drop: p.OverCap == config.OverCapDrop, Digest: p.OverCap == config.OverCapDigest,
			MaxDelay: p.MaxDelay, Shadow: p.Shadow, Calendars: cals, Quiet: quiet, Zone: zone}
		for _, other := range p.CountsToward {
			s.CountsToward = append(s.CountsToward, policies[other])
		}
		rules.Settings[name] = s
	}
	return rules, built, nil
}

// sameSender reports whether a and b deliver the same way: they differ at
// most in their bucket and shadow mode.
func sameSender(a, b config.Provider) bool {
	a.Rate, a.Burst, a.PriorityReserve, a.Shadow = 0, 0, 0, false
	b.Rate, b.Burst, b.PriorityReserve, b.Shadow = 0, 0, 0, false
	return reflect.DeepEqual(a, b)
}

// newSender returns what delivers provider p's messages. Errors name the
// provider and a file, never a secret.
func newSender(name string, p config.Provider, stdout io.Writer) (providers.Provider, error) {
	if p.Type == config.ProviderLog {
		w, err := output(p.Output, stdout)
		if err != nil {
			return nil, fmt.Errorf("provider %s: %w", name, err)
		}
		return providers.NewLog(name, w), nil
	}
	roots, err := p.RootCAs()
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", name, err)
	}
	if p.Type == config.ProviderWebhook {
		headers := make(map[string]string, len(p.Headers))
		for k, v := range p.Headers {
			headers[k] = string(v)
		}
		return providers.NewWebhook(name, string(p.URL), p.Timeout, headers, roots), nil
	}
	return newService(name, p, roots)
}

// reloader re-reads the config file on SIGHUP (see reload).
type reloader struct {
	path    string
	running *atomic.Pointer[config.Config] // the config in effect, which the dashboard reads
	senders senders
	th      *jobs.Throttle
	stdout  io.Writer
	stderr  io.Writer
	log     *slog.Logger
	counts  *sentCounts            // the demo's, else nil
	reloads *prometheus.CounterVec // by result (newReloads)
	rdb     redis.UniversalClient
	api     *api.Server // the HTTP API, if served: its keys and names reload too
	queues  []string    // the asynq queues served (servedQueues), for repace and reweigh
}

// run reloads at every signal on hup until ctx ends.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload(ctx)
		}
	}
}

// reload re-reads the config file (docs/rules.md#live-reload): an invalid
// one is refused, its problems printed as a start prints them.
func (r *reloader) reload(ctx context.Context) {
	r.log.Info("SIGHUP: reloading the config", "file", r.path)
	cfg, err := config.Load(r.path)
	if err == nil && r.counts != nil {
		demoRules(cfg)
		demoAPI(cfg)
	}
	var rules jobs.Rules
	var built senders
	if err == nil {
		rules, built, err = buildRules(cfg, r.stdout, r.counts, r.senders)
	}
	if err != nil {
		fmt.Fprintln(r.stderr, err)
		r.log.Error("config reload refused: the running config stays", "file", r.path)
		r.reloads.WithLabelValues(reloadRefused).Inc()
		return
	}
	for _, w := range append(cfg.Warnings(), cfg.Redis.Warnings()...) {
		r.log.Warn(w)
	}
	old := r.running.Load()
	if cfg.Redis.Shards == 0 {
		cfg.Redis.Shards = old.Redis.Shards // as resolved at the start (redisconn.Shards)
	}
	if !reflect.DeepEqual(cfg.Redis, old.Redis) || !reflect.DeepEqual(cfg.Worker, old.Worker) ||
		!reflect.DeepEqual(cfg.Campaigns, old.Campaigns) || cfg.Defaults != old.Defaults || cfg.Log != old.Log {
		r.log.Warn("config reload: changes to redis, worker, campaigns, defaults or log take effect at the next start")
	}
	reloadAPI(r.api, cfg, old, r.log)
	r.th.Swap(rules)
	r.running.Store(cfg)
	r.senders = built
	r.log.Info("config reloaded", "file", r.path, "policies", len(cfg.Policies), "providers", len(cfg.Providers))
	r.reloads.WithLabelValues(reloadSuccess).Inc()
	repace(ctx, r.th, r.rdb, r.queues, r.log)
	if !maps.Equal(cfg.Tenants.Weights, old.Tenants.Weights) {
		reweigh(ctx, r.th, r.rdb, r.queues, r.log)
	}
}

// repace moves the work waiting on each provider whose rate changed to its
// new rate (docs/booking.md#a-change-of-rate); a failure is logged.
func repace(ctx context.Context, th *jobs.Throttle, rdb redis.UniversalClient, queues []string, log *slog.Logger) {
	if _, err := th.Repace(ctx, rdb, queues); err != nil {
		log.Warn("re-pacing the work waiting on a changed provider failed: it goes at its old pace", "err", err)
	}
}

// reweigh moves the tenants' lines waiting on each provider to the
// config's weights (docs/booking.md#a-change-of-weight); a failure is logged.
func reweigh(ctx context.Context, th *jobs.Throttle, rdb redis.UniversalClient, queues []string, log *slog.Logger) {
	if _, err := th.Reweigh(ctx, rdb, queues); err != nil {
		log.Warn("re-pacing the tenants' lines to changed weights failed: the work in line keeps its old shares", "err", err)
	}
}
