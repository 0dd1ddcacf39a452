// Package config reads the configuration file of the worker and enqueue
// (config.yaml at the repository root is the commented example and the
// default), checks every key and value, and builds the throttle rules and
// queues from it. Connecting to Redis is package internal/redisconn's.
//
// A file is decoded onto Default() by the structs' yaml tags, the file's
// keys: a key the file leaves out keeps its default, a key it sets replaces
// it (a map such as worker.queues as a whole). Checking is strict, and every
// problem in the file is reported at once, one per line in file order (up
// to 20), naming the file, the line, the setting's path and the bad value:
//
//	config.yaml:12: policies.marketing[1].per: must be > 0 (got 0s)
//
// Durations are Go durations ("500ms", "90s", "1h30m") and may start with a
// number of days: "7d", "1d12h", "1.5d" (a day is 24h).
//
// A new setting is a field with its yaml tag (decode.go lists the tag
// options), its default in Default (in an entry of a map or a list, in its
// type's Fill) and its check in validate.go. A Config holds the values in
// effect, so an explicit 0s or "" in the file keeps its meaning ("off");
// build one by hand from Default().
package config

import (
	"cmp"
	"encoding/json"
	"maps"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/schedule"
	"github.com/notify-throttle/throttler/recovery"
	"github.com/notify-throttle/throttler/throttle"
)

// Embedded is the redis.url that runs an in-process Redis-compatible server
// (miniredis) instead of connecting to Redis.
const Embedded = redisconn.Embedded

// Provider types.
const (
	// ProviderLog writes one JSON line per message.
	ProviderLog = "log"
	// ProviderWebhook POSTs each message as JSON to a URL.
	ProviderWebhook = "webhook"
)

// Dashboard auth kinds.
const (
	// DashboardBasic asks for a user name and password (HTTP basic auth).
	DashboardBasic = "basic"
	// DashboardBearer asks for "Authorization: Bearer <token>".
	DashboardBearer = "bearer"
)

// Default returns the default configuration: embedded Redis, the default
// worker settings, no policies, providers or campaigns.
func Default() *Config {
	return &Config{
		Redis: Redis{URL: Embedded, EmbeddedAddr: redisconn.DefaultEmbeddedAddr, Prefix: throttle.DefaultPrefix},
		Worker: Worker{
			Concurrency:     20,
			Queues:          map[string]int{"default": 1},
			ShutdownTimeout: 10 * time.Second,
			HTTPAddr:        "127.0.0.1:9464",
			Dashboard:       Dashboard{Enabled: true, SecretEnv: "THROTTLER_DASHBOARD_SECRET"},
			InlineWait:      2500 * time.Millisecond,
			Jitter:          time.Second,
			SentMarks:       time.Hour,
			RememberTakes:   throttle.DefaultRemember,
			DeadAfter:       recovery.DefaultDeadAfter,
		},
		Policies:  map[string]Policy{},
		Providers: map[string]Provider{},
		Defaults:  Defaults{Queue: "default"},
		Tenants:   Tenants{Weights: map[string]int{}},
	}
}

// Config is the whole configuration: the file's sections, in its order.
type Config struct {
	Redis  Redis  `yaml:"redis"`  // where the job queue and the throttle state live
	Worker Worker `yaml:"worker"` // tunes the worker process
	// Policies are the recipient policies by name: each a list of sliding
	// windows that all must allow a message. Default none.
	Policies map[string]Policy `yaml:"policies"`
	// Providers deliver messages, by name, each with its token bucket.
	Providers map[string]Provider `yaml:"providers"`
	Defaults  Defaults            `yaml:"defaults"`  // what a notification that does not say uses
	Campaigns []Campaign          `yaml:"campaigns"` // scheduled sends to an audience
	Tenants   Tenants             `yaml:"tenants"`   // the senders sharing the providers

	src *source // where the values came from; nil for a Config built in code
}

// Tenants are the senders (a notification's tenant, a campaign's) that
// share a provider fairly: when several wait on one provider, each gets the
// provider's rate × its weight / the sum of the waiting tenants' weights;
// a tenant alone uses the whole rate (see throttle.Request.Tenant).
type Tenants struct {
	// Weights are tenants' weights by name, each 1 to throttle.MaxWeight.
	// A tenant not listed (the default tenant of notifications that name
	// none too) weighs 1. Default none.
	Weights map[string]int `yaml:"weights"`
}

// Redis says where Redis is and how to log in to it (see
// redisconn.Config): the redis section of the file.
type Redis = redisconn.Config

// TLS says how to connect to Redis over TLS (see redisconn.TLS).
type TLS = redisconn.TLS

// Worker tunes the worker process.
type Worker struct {
	// Concurrency is how many jobs one worker handles at once.
	Concurrency int `yaml:"concurrency"`
	// Queues maps each queue to its priority (higher is served more often).
	Queues map[string]int `yaml:"queues"`
	// ShutdownTimeout is how long in-flight sends may finish after
	// SIGINT/SIGTERM.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// HTTPAddr is the host:port serving /healthz, /metrics and the
	// dashboard; "" (or no value) turns them all off. metrics_addr, its old
	// name, still works and Warnings says so.
	HTTPAddr string `yaml:"http_addr,null,alias=metrics_addr"`
	// Dashboard says who may open the dashboard and what it may do.
	Dashboard Dashboard `yaml:"dashboard"`
	// InlineWait is the longest a job sleeps in the worker for its moment
	// instead of being deferred; 0 always defers. A booked job is woken
	// early by up to InlineWait - 1s (at most 1.5s) to claim its moment
	// before it comes.
	InlineWait time.Duration `yaml:"inline_wait"`
	// Book makes a job that may not go within InlineWait book the earliest
	// moment its policy and provider allow and wait for it (see
	// jobs.Throttle.Book). Off when the file does not say; config.yaml
	// turns it on.
	Book bool `yaml:"book"`
	// PriorityQueues are the queues (of Queues) whose jobs skip the
	// providers' lines and may take their priority_reserve.
	PriorityQueues []string `yaml:"priority_queues"`
	// Jitter is the most a deferred job's wake-up is randomly delayed, so
	// that many do not wake at once; 0 for none.
	Jitter time.Duration `yaml:"jitter"`
	// SentMarks is how long a worker remembers that a task's message was
	// accepted by its provider, so that a redelivery of it is not sent
	// again (jobs.SentMarks). Zero turns the markers off.
	SentMarks time.Duration `yaml:"sent_marks"`
	// RememberTakes is how long a provider's bucket keeps a take after its
	// slot ended (throttle.Options.Remember); each kept take costs about
	// 140 bytes of Redis memory. At least 1s.
	RememberTakes time.Duration `yaml:"remember_takes"`
	// DeadAfter is how long a worker may show no sign of life in Redis
	// before the others take it for dead and hand its tasks over
	// (recovery.Options.DeadAfter); 0 leaves them to asynq's own recovery
	// (a minute or two). 0 or at least 1s.
	DeadAfter time.Duration `yaml:"dead_after"`
}

// Dashboard says who may open the dashboard (the throttle view at /throttle
// and asynq's dashboard at /monitoring/, on Worker.HTTPAddr) and what it may
// do. /healthz and /metrics stay open whatever it says.
type Dashboard struct {
	Enabled bool `yaml:"enabled"` // serves the dashboard
	// Actions lets the asynq dashboard change things (run, delete, archive
	// tasks; pause queues); without it, it only shows them.
	Actions bool `yaml:"actions"`
	// Auth is "" (none), DashboardBasic or DashboardBearer. Without auth the
	// address must be a loopback one, unless InsecureNoAuth.
	Auth     string `yaml:"auth"`
	Username string `yaml:"username"` // the basic-auth user name
	// SecretEnv names the environment variable holding the password
	// (basic) or the token (bearer): never the file.
	SecretEnv string `yaml:"secret_env"`
	// InsecureNoAuth serves the dashboard without auth on an address that
	// is not loopback. Warnings says so.
	InsecureNoAuth bool `yaml:"insecure_no_auth"`
}

// Policy is a recipient policy: a message passes only if every window allows
// it. In the file, a list of {limit: 1, per: 24h}, or a mapping of the
// windows and the settings below ({windows: [...], over_cap: drop}).
type Policy struct {
	Windows []throttle.Window `yaml:"windows"`
	// OverCap is what happens to a message the windows hold back:
	// OverCapDefer (the default) waits for the moment they allow,
	// OverCapDrop archives it at once, OverCapDigest folds it into the
	// recipient's next digest (one message carrying every folded one).
	OverCap string `yaml:"over_cap,oneof=defer|drop|digest"`
	// MaxDelay is, with defer, the longest a message may wait after it was
	// enqueued: one whose moment would be later expires. Default 0: none.
	MaxDelay time.Duration `yaml:"max_delay"`
	// CountsToward names other policies that each of this policy's
	// messages counts toward, as if it were theirs, without being held
	// back by them (a password reset counting toward marketing's cap).
	// Default none.
	CountsToward []string `yaml:"counts_toward"`
	// Shadow runs the policy in shadow mode: its windows count every
	// message but hold none back, and what they would have done is logged
	// and counted. Default false.
	Shadow bool `yaml:"shadow"`
	// Calendar are windows of the recipient's calendar, checked with
	// Windows: {limit: 1, per: day}. Default none.
	Calendar []Calendar `yaml:"calendar"`
	// Quiet are quiet hours, "21:00-08:00" or with days first ("sun
	// 00:00-24:00", "mon-fri 18:00-09:00"): a message that would go inside
	// them waits until they end. Default none.
	Quiet []string `yaml:"quiet"`
	// TimeZone is the IANA zone calendar windows and quiet hours are kept in
	// for a notification that names none (its tz). Default UTC.
	TimeZone string `yaml:"timezone"`
}

// Calendar is a calendar window of a policy, in the recipient's zone.
type Calendar struct {
	Limit int    `yaml:"limit,required"`
	Per   string `yaml:"per,required,oneof=day|week|month"`
	// WeekStart is the first day of a week. Default monday.
	WeekStart string `yaml:"week_start,oneof=monday|tuesday|wednesday|thursday|friday|saturday|sunday"`
}

// Fill gives a policy read from a file its defaults.
func (p *Policy) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("over_cap") {
		p.OverCap = OverCapDefer
	}
}

// Over-cap actions (Policy.OverCap).
const (
	OverCapDefer  = "defer"
	OverCapDrop   = "drop"
	OverCapDigest = "digest"
)

// Provider delivers messages and limits them with a token bucket.
type Provider struct {
	Type  string  `yaml:"type,required,oneof=log|webhook"` // ProviderLog or ProviderWebhook
	Rate  float64 `yaml:"rate,required"`                   // the bucket's refill per second, fractions allowed
	Burst int     `yaml:"burst,required"`                  // the bucket's size
	// Shadow runs the bucket in shadow mode: no message waits for it, and
	// what it would have done is logged and counted. Default false.
	Shadow bool `yaml:"shadow"`
	// PriorityReserve is how much of Burst only jobs of the priority queues
	// may take (throttle.Bucket.WithReserve), from 0 to Burst - 1. Default
	// Burst/5.
	PriorityReserve int `yaml:"priority_reserve"`
	// Output is where a log provider writes: "stdout", "stderr" or a file
	// path. Default "stdout" for a log provider; only for log.
	Output string `yaml:"output"`
	// URL is where a webhook provider POSTs, http:// or https://, with
	// credentials (https://user:password@host/...) if the provider takes
	// them there. Required for a webhook provider; only for webhook.
	URL Secret `yaml:"url"`
	// Timeout bounds one webhook POST. Default 5s for a webhook provider;
	// only for webhook.
	Timeout time.Duration `yaml:"timeout"`
	// Headers are added to every webhook POST, an API key for instance.
	// Only for webhook.
	Headers map[string]Secret `yaml:"headers"`
}

// Fill gives a provider read from a file the defaults of its type.
func (p *Provider) Fill(has func(key string) bool, required func(key, why string)) {
	if !has("priority_reserve") {
		p.PriorityReserve = p.Burst / 5
	}
	switch {
	case p.Type == ProviderLog && !has("output"):
		p.Output = "stdout"
	case p.Type == ProviderWebhook:
		if !has("url") {
			required("url", " for a webhook provider")
		}
		if !has("timeout") {
			p.Timeout = 5 * time.Second
		}
	}
}

// Defaults name what a notification uses when it does not say.
type Defaults struct {
	Policy   string `yaml:"policy"`   // a policy; "": a notification must name one
	Provider string `yaml:"provider"` // a provider; "": a notification must name one
	Queue    string `yaml:"queue"`    // a queue of worker.queues
}

// Route is where a notification goes: its policy, provider and queue.
type Route struct {
	Policy, Provider, Queue string
}

// Route returns r with what it leaves empty taken from c's defaults. It is
// the one place the defaults apply: to a notification enqueued, a
// campaign's, the demo's.
func (c *Config) Route(r Route) Route {
	return Route{
		Policy:   cmp.Or(r.Policy, c.Defaults.Policy),
		Provider: cmp.Or(r.Provider, c.Defaults.Provider),
		Queue:    cmp.Or(r.Queue, c.Defaults.Queue),
	}
}

// Campaign is a scheduled send to an audience: at every tick of Cron, one
// notification per recipient (see package campaign).
type Campaign struct {
	// Name identifies the campaign (1-64 of A-Z a-z 0-9 _ . -). Required.
	Name string `yaml:"name,required"`
	// Cron is the schedule (see Schedule): 5 fields, 6 with a leading
	// seconds field, or a descriptor such as @daily or @every 10m. Required.
	Cron string `yaml:"cron,required"`
	// Timezone is the IANA zone Cron is read in. Default "" (UTC).
	Timezone string `yaml:"timezone"`
	// RecipientTZ is the IANA zone of recipients whose audience entry
	// names none (a second, tab-separated column). Default "": the
	// policy's timezone.
	RecipientTZ string `yaml:"recipient_tz"`
	// Audience says where the recipients come from. Required.
	Audience Audience `yaml:"audience,required"`
	// Policy, Provider and Queue name what the campaign's notifications
	// use. Default "": Defaults.Policy, Defaults.Provider, Defaults.Queue.
	Policy   string `yaml:"policy"`
	Provider string `yaml:"provider"`
	// Template names the message template. Required.
	Template string `yaml:"template,required"`
	// Data fills the template, as a JSON object; in the file, any mapping.
	Data  json.RawMessage `yaml:"data"`
	Queue string          `yaml:"queue"`
	// SendByWindow is how long after its tick a message may still be
	// delivered; later it expires. Default 0: no deadline.
	SendByWindow time.Duration `yaml:"send_by_window"`
	// CatchUp is how old a tick missed while no worker ran may be and
	// still be sent when a worker starts; only the latest missed tick is.
	// Default 1h in a file; 0 turns catching up off.
	CatchUp time.Duration `yaml:"catch_up"`
}

// Fill gives a campaign read from a file its defaults.
func (c *Campaign) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("catch_up") {
		c.CatchUp = time.Hour
	}
}

// Schedule returns when c fires, read in c's time zone (see schedule.Parse).
func (c Campaign) Schedule() (cron.Schedule, error) {
	loc, err := c.Location()
	if err != nil {
		return nil, err
	}
	return schedule.Parse(c.Cron, loc)
}

// Location returns the time zone c's schedule is read in: UTC when
// Timezone is empty (see schedule.Zone).
func (c Campaign) Location() (*time.Location, error) { return schedule.Zone(c.Timezone) }

// Route is the campaign's policy, provider and queue, defaults applied.
func (c Campaign) Route(cfg *Config) Route {
	return cfg.Route(Route{Policy: c.Policy, Provider: c.Provider, Queue: c.Queue})
}

// Audience is where a campaign's recipients come from: exactly one of File
// and RedisSet.
type Audience struct {
	// File is a text file of one recipient per line, read afresh at every
	// tick; a relative path is relative to the config file's directory.
	File string `yaml:"file,path"`
	// RedisSet is the key of a Redis set, in the Redis of redis.url, whose
	// members are the recipients.
	RedisSet string `yaml:"redis_set"`
}

// String describes a, for logs: "file audiences/digest.txt" or "redis set
// digest:subscribers".
func (a Audience) String() string {
	if a.RedisSet != "" {
		return "redis set " + a.RedisSet
	}
	return "file " + a.File
}

// Queues returns a copy of the queues and their priorities, as
// asynq.Config.Queues takes them.
func (c *Config) Queues() map[string]int {
	return maps.Clone(c.Worker.Queues)
}
