// Package config reads the configuration file of the worker and enqueue
// (config.yaml at the repository root documents every setting), checks it
// and builds the throttle's rules from it. A file is decoded onto Default()
// (decode.go) and validated (validate.go); every problem is reported at
// once, each an *Error naming the file, line, setting and bad value. A key
// left out keeps its default; a key set replaces it (a map as a whole).
//
// A new setting is a field with its yaml tag, its default in Default (or
// its type's Fill) and its check in validate.go. A Config holds the values
// in effect: an explicit 0s or "" keeps its meaning ("off"); build one in
// code from Default().
package config

import (
	"cmp"
	"encoding/json"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/notify-throttle/throttler/fleet"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/schedule"
	"github.com/notify-throttle/throttler/throttle"
)

// Embedded is the redis.url that runs an in-process Redis-compatible server
// (miniredis) instead of connecting to Redis.
const Embedded = redisconn.Embedded

// Provider types, dashboard auth kinds and over-cap actions.
const (
	ProviderLog      = "log"      // writes one JSON line per message
	ProviderWebhook  = "webhook"  // POSTs each message as JSON to a URL
	ProviderSMTP     = "smtp"     // an SMTP server
	ProviderSES      = "ses"      // Amazon SES v2
	ProviderTwilio   = "twilio"   // Twilio's Messages API (SMS)
	ProviderFCM      = "fcm"      // Firebase Cloud Messaging HTTP v1
	ProviderAPNs     = "apns"     // Apple Push Notification service
	ProviderSendGrid = "sendgrid" // SendGrid's v3 Mail Send API
	DashboardBasic   = "basic"    // a user name and password (HTTP basic auth)
	DashboardBearer  = "bearer"   // "Authorization: Bearer <token>"
	OverCapDefer     = "defer"
	OverCapDrop      = "drop"
	OverCapDigest    = "digest"
)

// Default returns the default configuration: embedded Redis, no policies,
// providers or campaigns.
func Default() *Config {
	return &Config{
		Redis: Redis{URL: Embedded, EmbeddedAddr: redisconn.DefaultEmbeddedAddr, Prefix: throttle.DefaultPrefix},
		Worker: Worker{
			Concurrency:     20,
			Queues:          map[string]int{"default": 1},
			ShutdownTimeout: 10 * time.Second,
			PollInterval:    100 * time.Millisecond,
			HTTPAddr:        "127.0.0.1:9464",
			Dashboard:       Dashboard{Enabled: true, SecretEnv: "THROTTLER_DASHBOARD_SECRET"},
			InlineWait:      2500 * time.Millisecond,
			Book:            true,
			BookAhead:       5 * time.Second,
			Jitter:          time.Second,
			SentMarks:       time.Hour,
			RememberTakes:   throttle.DefaultRemember,
			WindowMargin:    DefaultWindowMargin,
			DeadAfter:       fleet.DefaultDeadAfter,
		},
		Policies:  map[string]Policy{},
		Providers: map[string]Provider{},
		Defaults:  Defaults{Queue: "default"},
		Tenants:   Tenants{Weights: map[string]int{}},
		Events:    defaultEvents(),
		Log:       Log{Format: LogText, Level: "info"},
	}
}

// DefaultWindowMargin is worker.window_margin's default: twice the worst
// send-latency spread seen in a chaos run (docs/rules.md#held-at-the-provider-with-a-margin).
const DefaultWindowMargin = 250 * time.Millisecond

// Config is the whole configuration: the file's sections, in its order.
// config.yaml documents every setting; a field's comment gives its default.
type Config struct {
	Redis     Redis               `yaml:"redis"`
	Worker    Worker              `yaml:"worker"`
	Policies  map[string]Policy   `yaml:"policies"`  // by name; default none
	Providers map[string]Provider `yaml:"providers"` // by name; default none
	Defaults  Defaults            `yaml:"defaults"`
	Campaigns []Campaign          `yaml:"campaigns"`
	Tenants   Tenants             `yaml:"tenants"`
	API       API                 `yaml:"api"`
	Events    Events              `yaml:"events"`
	Log       Log                 `yaml:"log"`

	src *source // where the values came from; nil for a Config built in code
}

// Tenants weigh the tenants' fair shares (docs/booking.md#fair-shares-between-tenants).
type Tenants struct {
	Weights map[string]int `yaml:"weights"` // by tenant; one not listed weighs 1
}

// Log says how the worker writes its log (to stderr).
type Log struct {
	Format string `yaml:"format,oneof=text|json"`            // LogText or LogJSON; default text
	Level  string `yaml:"level,oneof=debug|info|warn|error"` // the lowest level written; default info
}

// Log formats.
const (
	LogText = "text" // slog's key=value lines
	LogJSON = "json" // one JSON object per line
)

// Redis says where Redis is and how to log in (see redisconn.Config).
type Redis = redisconn.Config

// TLS says how to connect to Redis over TLS (see redisconn.TLS).
type TLS = redisconn.TLS

// Worker tunes the worker process; Default gives each field's default.
type Worker struct {
	Concurrency     int            `yaml:"concurrency"`                       // jobs one worker handles at once
	Queues          map[string]int `yaml:"queues"`                            // each queue's priority
	ShutdownTimeout time.Duration  `yaml:"shutdown_timeout"`                  // for in-flight sends after SIGTERM
	PollInterval    time.Duration  `yaml:"poll_interval"`                     // how often an idle worker looks for jobs
	HTTPAddr        string         `yaml:"http_addr,null,alias=metrics_addr"` // /healthz, /metrics, the dashboard; "": off
	Dashboard       Dashboard      `yaml:"dashboard"`
	InlineWait      time.Duration  `yaml:"inline_wait"`     // 0 always defers
	Book            bool           `yaml:"book"`            // default true
	BookAhead       time.Duration  `yaml:"book_ahead"`      // a booking's horizon; 0: no limit
	PriorityQueues  []string       `yaml:"priority_queues"` // default none
	Jitter          time.Duration  `yaml:"jitter"`          // 0: none
	SentMarks       time.Duration  `yaml:"sent_marks"`      // 0: off
	RememberTakes   time.Duration  `yaml:"remember_takes"`  // at least 1s
	WindowMargin    time.Duration  `yaml:"window_margin"`   // DefaultWindowMargin; 0 to 1m
	DeadAfter       time.Duration  `yaml:"dead_after"`      // 0: asynq's own recovery, else at least 1s
}

// Dashboard says who may open the dashboard (/throttle and asynq's
// /monitoring/) and what it may do; /healthz and /metrics stay open.
type Dashboard struct {
	Enabled        bool   `yaml:"enabled"`          // default true
	Actions        bool   `yaml:"actions"`          // run, delete, archive tasks; default false: view only
	Auth           string `yaml:"auth"`             // "" (none), DashboardBasic or DashboardBearer
	Username       string `yaml:"username"`         // for basic auth
	SecretEnv      string `yaml:"secret_env"`       // the variable of the password or token, never in the file
	InsecureNoAuth bool   `yaml:"insecure_no_auth"` // no auth off loopback; Warnings says so
}

// Policy is a recipient policy: a message passes only if every window allows
// it. In the file, a list of windows, or a mapping {windows: [...], ...}.
type Policy struct {
	Windows      []throttle.Window `yaml:"windows"`
	OverCap      string            `yaml:"over_cap,oneof=defer|drop|digest"` // default defer
	MaxDelay     time.Duration     `yaml:"max_delay"`                        // with defer only; 0: none
	CountsToward []string          `yaml:"counts_toward"`                    // default none
	Shadow       bool              `yaml:"shadow"`                           // default false
	Calendar     []Calendar        `yaml:"calendar"`                         // default none
	Quiet        []string          `yaml:"quiet"`                            // "mon-fri 18:00-09:00"; default none
	TimeZone     string            `yaml:"timezone"`                         // of Calendar and Quiet; default UTC
}

// Calendar is a calendar window of a policy, in the recipient's zone.
type Calendar struct {
	Limit     int    `yaml:"limit,required"`
	Per       string `yaml:"per,required,oneof=day|week|month"`
	WeekStart string `yaml:"week_start,oneof=monday|tuesday|wednesday|thursday|friday|saturday|sunday"` // default monday
}

// Fill gives a policy read from a file its defaults.
func (p *Policy) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("over_cap") {
		p.OverCap = OverCapDefer
	}
}

// Provider delivers messages and limits them with a token bucket. The
// keys after Headers are the services' (services.go says which type takes which).
type Provider struct {
	Type            string            `yaml:"type,required,oneof=log|webhook|smtp|ses|twilio|fcm|apns|sendgrid"`
	Rate            float64           `yaml:"rate,required"` // per second, fractions allowed
	Burst           int               `yaml:"burst,required"`
	Shadow          bool              `yaml:"shadow"`                      // default false
	PriorityReserve int               `yaml:"priority_reserve"`            // default Burst/5
	Output          string            `yaml:"output"`                      // log only; default stdout
	URL             Secret            `yaml:"url,secret=URL"`              // webhook only; required
	Timeout         time.Duration     `yaml:"timeout"`                     // not log; default 5s webhook, 10s the services
	CAFile          string            `yaml:"ca_file,path"`                // not log: PEM certificates of CAs its TLS trusts besides the system's; default none
	Headers         map[string]Secret `yaml:"headers,secret=header value"` // webhook only; default none

	ScopePause time.Duration `yaml:"scope_pause"` // twilio (a sender's overflow), apns (a device's 429): a scoped pause naming no moment; default 1m
	MaxRetries int           `yaml:"max_retries"` // the services: tries after a temporary failure; default the task's
	Backoff    time.Duration `yaml:"backoff"`     // the services: first wait after one, doubled each time; default asynq's
	BaseURL    string        `yaml:"base_url"`    // ses, twilio, fcm, apns, sendgrid: default the service's own

	From                string `yaml:"from"`                                      // smtp, ses, sendgrid: an address; twilio: a number
	FromName            string `yaml:"from_name"`                                 // sendgrid
	MessagingServiceSID string `yaml:"messaging_service_sid"`                     // twilio: instead of from
	AccountSID          string `yaml:"account_sid"`                               // twilio
	Username            Secret `yaml:"username,secret=username"`                  // smtp; twilio: an API key SID (default account_sid)
	Password            Secret `yaml:"password,secret=password"`                  // smtp; twilio: the auth token or API key secret
	APIKey              Secret `yaml:"api_key,secret=API key"`                    // sendgrid
	Host                string `yaml:"host"`                                      // smtp
	Port                int    `yaml:"port"`                                      // smtp; default 587 (465 with tls: tls)
	TLS                 string `yaml:"tls,oneof=starttls|tls|opportunistic|none"` // smtp; default starttls

	Region           string        `yaml:"region"`                                     // ses
	AccessKeyID      Secret        `yaml:"access_key_id,secret=access key ID"`         // ses
	SecretAccessKey  Secret        `yaml:"secret_access_key,secret=secret access key"` // ses
	ConfigurationSet string        `yaml:"configuration_set"`                          // ses; default none
	QuotaReset       time.Duration `yaml:"quota_reset"`                                // ses, smtp: after 00:00 UTC; default 0

	ProjectID       string `yaml:"project_id"`            // fcm
	CredentialsFile string `yaml:"credentials_file,path"` // fcm: a service account's JSON key; or
	Token           Secret `yaml:"token,secret=token"`    // fcm: a static OAuth2 access token
	TokenURL        string `yaml:"token_url"`             // fcm; default the key's token_uri

	TeamID  string `yaml:"team_id"`       // apns
	KeyID   string `yaml:"key_id"`        // apns
	KeyFile string `yaml:"key_file,path"` // apns: the .p8 signing key
	Topic   string `yaml:"topic"`         // apns: the app's bundle ID

	Feedback Feedback `yaml:"feedback"` // ses, sendgrid, twilio: what the service reports later; default none (see Feedback)
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
	case serviceTypes[p.Type] != nil:
		p.fillService(has, required)
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

// Route returns r with what it leaves empty taken from c's defaults, the
// one place they apply.
func (c *Config) Route(r Route) Route {
	return Route{
		Policy:   cmp.Or(r.Policy, c.Defaults.Policy),
		Provider: cmp.Or(r.Provider, c.Defaults.Provider),
		Queue:    cmp.Or(r.Queue, c.Defaults.Queue),
	}
}

// Campaign sends one notification per recipient of its audience at every
// tick of Cron (see package campaign).
type Campaign struct {
	Name         string          `yaml:"name,required"` // 1-64 of A-Z a-z 0-9 _ . -
	Cron         string          `yaml:"cron,required"` // see schedule.Parse
	Timezone     string          `yaml:"timezone"`      // Cron's zone; default UTC
	RecipientTZ  string          `yaml:"recipient_tz"`  // default: the policy's
	Audience     Audience        `yaml:"audience,required"`
	Policy       string          `yaml:"policy"`   // "": the default (see Route)
	Provider     string          `yaml:"provider"` // "": the default
	Template     string          `yaml:"template,required"`
	Data         json.RawMessage `yaml:"data"`           // the template's, a JSON object; in the file, any mapping
	Queue        string          `yaml:"queue"`          // "": the default
	SendByWindow time.Duration   `yaml:"send_by_window"` // 0: no deadline
	CatchUp      time.Duration   `yaml:"catch_up"`       // default 1h in a file; 0: off
	Tenant       string          `yaml:"tenant"`         // default in a file: Name; "": the default tenant
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

// Location returns the time zone of c's schedule (see schedule.Zone).
func (c Campaign) Location() (*time.Location, error) { return schedule.Zone(c.Timezone) }

// Route is the campaign's policy, provider and queue, defaults applied.
func (c Campaign) Route(cfg *Config) Route {
	return cfg.Route(Route{Policy: c.Policy, Provider: c.Provider, Queue: c.Queue})
}

// Audience is where a campaign's recipients come from, one of the two.
type Audience struct {
	File     string `yaml:"file,path"` // one recipient per line, read at every tick
	RedisSet string `yaml:"redis_set"` // a set's key in redis.url's Redis
}

// String describes a for logs: "file digest.txt" or "redis set subscribers".
func (a Audience) String() string {
	if a.RedisSet != "" {
		return "redis set " + a.RedisSet
	}
	return "file " + a.File
}
