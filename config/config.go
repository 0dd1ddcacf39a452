// Package config reads the configuration file of the worker and enqueue
// (config.yaml at the repository root is the commented example and the
// default), checks every key and value, and builds the throttle rules and
// queues from it. Connecting to Redis is package internal/redisconn's.
//
// A file is read in three steps. One walk of its YAML node tree decodes it
// onto Default() by the structs' yaml tags (decode.go), rejecting unknown
// keys and values of the wrong type, and indexes each value's line by its
// path. Validate then checks the values. Every problem is reported at once,
// one per line in file order (up to 20), as an *Error naming the file, the
// line, the setting's path and the bad value:
//
//	config.yaml:12: policies.marketing[1].per: must be > 0 (got 0s)
//
// A key the file leaves out keeps its default; a key it sets replaces it (a
// map such as worker.queues as a whole). Durations are Go durations ("90s",
// "1h30m") that may start with days: "7d", "1d12h", "1.5d".
//
// A new setting is a field with its yaml tag, its default in Default (in an
// entry of a map or a list, in its type's Fill), and its check in
// validate.go. A Config holds the values in effect, so an explicit 0s or ""
// keeps its meaning ("off"); build one by hand from Default().
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
	ProviderLog     = "log"     // writes one JSON line per message
	ProviderWebhook = "webhook" // POSTs each message as JSON to a URL
)

// Dashboard auth kinds.
const (
	DashboardBasic  = "basic"  // a user name and password (HTTP basic auth)
	DashboardBearer = "bearer" // "Authorization: Bearer <token>"
)

// Over-cap actions (Policy.OverCap).
const (
	OverCapDefer  = "defer"
	OverCapDrop   = "drop"
	OverCapDigest = "digest"
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
			BookAhead:       5 * time.Second,
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
	// Policies are the recipient policies by name, each windows that all
	// must allow a message. Default none.
	Policies map[string]Policy `yaml:"policies"`
	// Providers deliver messages, by name, each with its token bucket.
	Providers map[string]Provider `yaml:"providers"`
	Defaults  Defaults            `yaml:"defaults"`  // what a notification that does not say uses
	Campaigns []Campaign          `yaml:"campaigns"` // scheduled sends to an audience
	Tenants   Tenants             `yaml:"tenants"`   // the senders sharing the providers

	src *source // where the values came from; nil for a Config built in code
}

// Tenants are the senders (a notification's tenant, a campaign's) that
// share a provider fairly: when several wait on one, each gets its rate ×
// weight / the sum of the waiting weights (see throttle.Request.Tenant).
type Tenants struct {
	// Weights are tenants' weights by name, each 1 to throttle.MaxWeight;
	// a tenant not listed (the default tenant too) weighs 1. Default none.
	Weights map[string]int `yaml:"weights"`
}

// Redis says where Redis is and how to log in (see redisconn.Config).
type Redis = redisconn.Config

// TLS says how to connect to Redis over TLS (see redisconn.TLS).
type TLS = redisconn.TLS

// Worker tunes the worker process.
type Worker struct {
	Concurrency int            `yaml:"concurrency"` // jobs one worker handles at once
	Queues      map[string]int `yaml:"queues"`      // each queue's priority (higher: served more often)
	// ShutdownTimeout is how long in-flight sends may finish after
	// SIGINT/SIGTERM.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// HTTPAddr is the host:port of /healthz, /metrics and the dashboard; ""
	// (or no value) turns them off. metrics_addr, its old name, still
	// works, and Warnings says so.
	HTTPAddr  string    `yaml:"http_addr,null,alias=metrics_addr"`
	Dashboard Dashboard `yaml:"dashboard"` // who may open the dashboard and what it may do
	// InlineWait is the longest a job sleeps in the worker for its moment
	// instead of being deferred; 0 always defers. A booked job wakes up to
	// InlineWait - 1s (at most 1.5s) early to claim its moment.
	InlineWait time.Duration `yaml:"inline_wait"`
	// Book makes a job that may not go within InlineWait book the earliest
	// moment its policy and provider allow (jobs.Throttle.Book). Off unless
	// the file says; config.yaml turns it on.
	Book bool `yaml:"book"`
	// BookAhead is how far ahead a booking may hold a provider's slot (its
	// horizon); a job further back waits with a place in its tenant's line
	// and books when its place comes (jobs.Throttle.BookAhead). 0: no limit.
	BookAhead time.Duration `yaml:"book_ahead"`
	// PriorityQueues are the queues whose jobs skip the providers' lines
	// and may take their priority_reserve.
	PriorityQueues []string `yaml:"priority_queues"`
	// Jitter is the most a deferred job's wake-up is randomly delayed, so
	// that many do not wake at once; 0 for none.
	Jitter time.Duration `yaml:"jitter"`
	// SentMarks is how long a worker remembers that a provider accepted a
	// task's message, so a redelivery is not sent again; 0 turns it off.
	SentMarks time.Duration `yaml:"sent_marks"`
	// RememberTakes is how long a provider's bucket keeps a take after its
	// slot ended (about 140 bytes of Redis each). At least 1s.
	RememberTakes time.Duration `yaml:"remember_takes"`
	// DeadAfter is how long a worker may show no sign of life before the
	// others hand its tasks over (recovery.Options.DeadAfter); 0 leaves
	// them to asynq's own recovery (a minute or two). 0 or at least 1s.
	DeadAfter time.Duration `yaml:"dead_after"`
}

// Dashboard says who may open the dashboard (/throttle and asynq's
// /monitoring/ on Worker.HTTPAddr) and what it may do. /healthz and
// /metrics stay open whatever it says.
type Dashboard struct {
	Enabled bool `yaml:"enabled"` // serves the dashboard
	// Actions lets the asynq dashboard run, delete and archive tasks and
	// pause queues; without it, it only shows them.
	Actions bool `yaml:"actions"`
	// Auth is "" (none), DashboardBasic or DashboardBearer. Without auth the
	// address must be a loopback one, unless InsecureNoAuth.
	Auth     string `yaml:"auth"`
	Username string `yaml:"username"` // the basic-auth user name
	// SecretEnv names the environment variable holding the password or
	// token: never the file.
	SecretEnv string `yaml:"secret_env"`
	// InsecureNoAuth serves the dashboard without auth off loopback.
	// Warnings says so.
	InsecureNoAuth bool `yaml:"insecure_no_auth"`
}

// Policy is a recipient policy: a message passes only if every window allows
// it. In the file, a list of windows ({limit: 1, per: 24h}), or a mapping
// of them and the settings below ({windows: [...], over_cap: drop}).
type Policy struct {
	Windows []throttle.Window `yaml:"windows"`
	// OverCap is what happens to a message the windows hold back: defer
	// (the default) waits for its moment, drop archives it at once, digest
	// folds it into the recipient's next digest.
	OverCap string `yaml:"over_cap,oneof=defer|drop|digest"`
	// MaxDelay is, with defer, the longest a message may wait after it was
	// enqueued; one whose moment is later expires. Default 0: none.
	MaxDelay time.Duration `yaml:"max_delay"`
	// CountsToward names policies that each message of this one counts
	// toward, without being held back by them. Default none.
	CountsToward []string `yaml:"counts_toward"`
	// Shadow counts every message but holds none back, logging and
	// counting what the windows would have done. Default false.
	Shadow bool `yaml:"shadow"`
	// Calendar are windows of the recipient's calendar, checked with
	// Windows: {limit: 1, per: day}. Default none.
	Calendar []Calendar `yaml:"calendar"`
	// Quiet are quiet hours, "21:00-08:00" or with days first ("mon-fri
	// 18:00-09:00"): a message due inside them waits until they end.
	Quiet []string `yaml:"quiet"`
	// TimeZone is the IANA zone of calendar windows and quiet hours for a
	// notification that names none. Default UTC.
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

// Provider delivers messages and limits them with a token bucket.
type Provider struct {
	Type  string  `yaml:"type,required,oneof=log|webhook"` // ProviderLog or ProviderWebhook
	Rate  float64 `yaml:"rate,required"`                   // the bucket's refill per second, fractions allowed
	Burst int     `yaml:"burst,required"`                  // the bucket's size
	// Shadow holds no message back, logging and counting what the bucket
	// would have done. Default false.
	Shadow bool `yaml:"shadow"`
	// PriorityReserve is how much of Burst only the priority queues' jobs
	// may take, 0 to Burst - 1. Default Burst/5.
	PriorityReserve int `yaml:"priority_reserve"`
	// Output is where a log provider writes: stdout (the default), stderr
	// or a file path.
	Output string `yaml:"output"`
	// URL is where a webhook provider POSTs, http:// or https://, with
	// credentials if the provider takes them there. Required for webhook.
	URL Secret `yaml:"url"`
	// Timeout bounds one webhook POST. Default 5s for webhook.
	Timeout time.Duration `yaml:"timeout"`
	// Headers are added to every webhook POST, an API key for instance.
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

// Route returns r with what it leaves empty taken from c's defaults: the
// one place they apply, to a notification enqueued, a campaign's, the demo's.
func (c *Config) Route(r Route) Route {
	return Route{
		Policy:   cmp.Or(r.Policy, c.Defaults.Policy),
		Provider: cmp.Or(r.Provider, c.Defaults.Provider),
		Queue:    cmp.Or(r.Queue, c.Defaults.Queue),
	}
}

// Queues returns a copy of the queues and their priorities, as
// asynq.Config.Queues takes them.
func (c *Config) Queues() map[string]int { return maps.Clone(c.Worker.Queues) }

// Campaign is a scheduled send to an audience: at every tick of Cron, one
// notification per recipient (see package campaign).
type Campaign struct {
	Name string `yaml:"name,required"` // 1-64 of A-Z a-z 0-9 _ . -
	// Cron is the schedule: 5 fields, 6 with leading seconds, or a
	// descriptor such as @daily or @every 10m.
	Cron     string `yaml:"cron,required"`
	Timezone string `yaml:"timezone"` // the IANA zone Cron is read in; "": UTC
	// RecipientTZ is the zone of recipients whose audience entry names none
	// (a second, tab-separated column). "": the policy's.
	RecipientTZ string   `yaml:"recipient_tz"`
	Audience    Audience `yaml:"audience,required"`
	// Policy, Provider and Queue are the campaign's route; "" takes the
	// default (see Route).
	Policy   string `yaml:"policy"`
	Provider string `yaml:"provider"`
	Template string `yaml:"template,required"` // the message template's name
	// Data fills the template, as a JSON object; in the file, any mapping.
	Data  json.RawMessage `yaml:"data"`
	Queue string          `yaml:"queue"`
	// SendByWindow is how long after its tick a message may still go; later
	// it expires. Default 0: no deadline.
	SendByWindow time.Duration `yaml:"send_by_window"`
	// CatchUp is how old a tick missed while no worker ran may be and still
	// be sent at start (the latest only). Default 1h in a file; 0: off.
	CatchUp time.Duration `yaml:"catch_up"`
	// Tenant is the tenant of the campaign's notifications: whose fair
	// share of the provider they use (see Tenants). At most 256 bytes, no
	// control characters. Default in a file: the campaign's Name; "" is the
	// default tenant.
	Tenant string `yaml:"tenant"`
}

// Fill gives a campaign read from a file its defaults.
func (c *Campaign) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("catch_up") {
		c.CatchUp = time.Hour
	}
	if !has("tenant") {
		c.Tenant = c.Name
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

// Audience is where a campaign's recipients come from: exactly one of a
// File of one recipient per line, read at every tick (relative to the
// config file's directory), and the key of a Redis set in redis.url's Redis.
type Audience struct {
	File     string `yaml:"file,path"`
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
