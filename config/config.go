// Package config reads the worker's and enqueue's configuration file (see
// config.yaml at the repository root, the commented example and the default),
// checks every key and value, and builds what the program needs from it: the
// throttle rules, the queues and the Redis client.
//
// A file is read, parsed and validated starting from Default(): a key the
// file leaves out keeps its default, and a key it sets replaces the default
// (a map such as worker.queues as a whole). Checking is strict: an unknown or
// duplicated key, a value of the wrong type, a bad duration, a limit of zero
// or a policy, provider or queue referenced but not defined is an error that
// names the file, the line, the setting's path and the bad value:
//
//	config.yaml:12: policies.marketing[1].per: must be > 0 (got 0s)
//
// Every problem in the file is reported at once, one per line in file order
// (up to 20), so that a file can be fixed in one go.
//
// Durations are Go durations ("500ms", "90s", "1h30m", "168h") and may start
// with a number of days: "7d", "1d12h", "1.5d" (a day is 24h).
//
// Unlike option structs, whose zero value means "default", a Config holds
// the values in effect: Default() returns the defaults and Load starts from
// them, so an explicit 0s or "" in the file keeps its meaning ("off") and is
// not mistaken for "not set". Build a Config by hand from Default().
package config

import (
	"encoding/json"
	"maps"
	"time"

	"github.com/notify-throttle/throttler/throttle"
)

// Embedded is the redis.url that runs an in-process Redis-compatible server
// (miniredis) instead of connecting to Redis.
const Embedded = "embedded"

// Provider types.
const (
	// ProviderLog writes one JSON line per message.
	ProviderLog = "log"
	// ProviderWebhook POSTs each message as JSON to a URL.
	ProviderWebhook = "webhook"
)

// Default values of settings that have one.
const (
	DefaultEmbeddedAddr    = "127.0.0.1:6390"
	DefaultPrefix          = throttle.DefaultPrefix
	DefaultConcurrency     = 20
	DefaultQueue           = "default"
	DefaultShutdownTimeout = 10 * time.Second
	DefaultHTTPAddr        = "127.0.0.1:9464"
	DefaultInlineWait      = time.Second
	DefaultJitter          = time.Second
	DefaultSentMarks       = time.Hour
	DefaultRememberTakes   = throttle.DefaultRemember
	DefaultOutput          = "stdout"
	DefaultTimeout         = 5 * time.Second
	DefaultCatchUp         = time.Hour
)

// Config is the whole configuration: the file's sections, in its order.
type Config struct {
	// Redis says where the job queue and the throttle state live.
	Redis Redis
	// Worker tunes the worker process.
	Worker Worker
	// Policies are the recipient policies by name: each a list of sliding
	// windows that all must allow a message. Default none.
	Policies map[string]Policy
	// Providers deliver messages, by name, each with its token bucket.
	// Default none.
	Providers map[string]Provider
	// Defaults name what a notification that does not say uses.
	Defaults Defaults
	// Campaigns are scheduled sends to an audience. Default none.
	Campaigns []Campaign

	// src is where the values came from; nil for a Config built in code.
	src *source
}

// Redis says where Redis is (one of embedded, a URL or a cluster) and how
// to log in to it. REDIS_URL in the environment (see LoadWithEnv) replaces
// URL and Cluster, and REDIS_PASSWORD replaces Password and PasswordFile.
// String, GoString and every error hide the password.
type Redis struct {
	// URL is Embedded or a redis://, rediss:// (TLS) or unix:// URL, with
	// an optional user and password. Default Embedded, or "" when Cluster
	// is set.
	URL string
	// Cluster lists the host:port of some Redis Cluster nodes, instead of
	// URL. Default none.
	Cluster []string
	// Username is the ACL user to log in as, for a cluster, or for a URL
	// that names none. Default "": the URL's, else Redis's default user.
	Username string
	// Password is the password to log in with, for a cluster, or for a
	// URL that holds none. Prefer PasswordFile or REDIS_PASSWORD to
	// writing it in the file. Default "".
	Password string
	// PasswordFile is a file holding the password (a final line break is
	// ignored), read when connecting; instead of Password. A relative path
	// is relative to the config file's directory. Default "".
	PasswordFile string
	// TLS configures TLS, which a rediss:// URL or, for a cluster,
	// TLS.Enabled turns on. Default: off, and the system's CAs.
	TLS TLS
	// EmbeddedAddr is the loopback host:port the embedded server listens
	// on, so that another process (enqueue) can reach it. Default
	// DefaultEmbeddedAddr.
	EmbeddedAddr string
	// Prefix starts every throttle key; no '{' or '}'. Default
	// DefaultPrefix ("throttle:").
	Prefix string
}

// Worker tunes the worker process.
type Worker struct {
	// Concurrency is how many jobs one worker handles at once. Default 20.
	Concurrency int
	// Queues maps each queue to its priority (higher is served more
	// often). Default {"default": 1}.
	Queues map[string]int
	// ShutdownTimeout is how long in-flight sends may finish after
	// SIGINT/SIGTERM. Default 10s.
	ShutdownTimeout time.Duration
	// HTTPAddr is the host:port serving /healthz, /metrics and the
	// dashboard (/throttle and /monitoring/, see Dashboard); "" turns them
	// all off. In the file, http_addr; metrics_addr, its old name, still
	// works and Warnings says so. Default DefaultHTTPAddr.
	HTTPAddr string
	// Dashboard says who may open the dashboard and what it may do.
	Dashboard Dashboard
	// addrKey is the key the file set HTTPAddr with: "http_addr",
	// "metrics_addr" (the old name), or "" when it did not.
	addrKey string
	// InlineWait is the longest a job waiting only for its provider's
	// bucket sleeps instead of being deferred; 0 always defers. Default 1s.
	InlineWait time.Duration
	// Jitter is the most a deferred job's wake-up is randomly delayed, so
	// that many do not wake at once; 0 for none. Default 1s.
	Jitter time.Duration
	// SentMarks is how long a worker remembers that a task's message was
	// accepted by its provider, so that a redelivery of it is not sent
	// again (jobs.SentMarks). Zero turns the markers off.
	SentMarks time.Duration
	// RememberTakes is how long a provider's bucket remembers which task
	// took each token (throttle.Options.Remember): a task redelivered
	// within it passes the bucket without taking again, and a release
	// refunds exactly. Each remembered take costs about 150 bytes of Redis
	// memory. At least 1s. Default DefaultRememberTakes.
	RememberTakes time.Duration
}

// Policy is a recipient policy: a message passes only if every window allows
// it. In the file, a list of {limit: 1, per: 24h}.
type Policy []throttle.Window

// Provider delivers messages and limits them with a token bucket.
type Provider struct {
	// Type is ProviderLog or ProviderWebhook. Required.
	Type string
	// Rate is the bucket's refill in messages per second, fractions
	// allowed. Required.
	Rate float64
	// Burst is the bucket's size. Required.
	Burst int
	// Output is where a log provider writes: "stdout", "stderr" or a file
	// path. Default "stdout" for a log provider; only for log.
	Output string
	// URL is where a webhook provider POSTs, http:// or https://, with
	// credentials (https://user:password@host/...) if the provider takes
	// them there; a Secret, so it may come from the environment or a file.
	// Required for a webhook provider; only for webhook.
	URL Secret
	// Timeout bounds one webhook POST. Default 5s for a webhook provider;
	// only for webhook.
	Timeout time.Duration
	// Headers are added to every webhook POST, an API key for instance:
	// Secrets, so they may come from the environment or a file. Default
	// none; only for webhook.
	Headers map[string]Secret
}

// Defaults name what a notification uses when it does not say.
type Defaults struct {
	// Policy names a policy. Default "": a notification must name one.
	Policy string
	// Provider names a provider. Default "": a notification must name one.
	Provider string
	// Queue names a queue of worker.queues. Default "default".
	Queue string
}

// Campaign is a scheduled send to an audience: at every tick of Cron, one
// notification per recipient (see package campaign).
type Campaign struct {
	// Name identifies the campaign (1-64 of A-Z a-z 0-9 _ . -). Required.
	Name string
	// Cron is the schedule (see Schedule): 5 fields, 6 with a leading
	// seconds field, or a descriptor such as @daily or @every 10m. Required.
	Cron string
	// Timezone is the IANA zone Cron is read in. Default "" (UTC).
	Timezone string
	// Audience says where the recipients come from. Required.
	Audience Audience
	// Policy, Provider and Queue name what the campaign's notifications
	// use. Default "": Defaults.Policy, Defaults.Provider, Defaults.Queue.
	Policy   string
	Provider string
	Queue    string
	// Template names the message template. Required.
	Template string
	// Data fills the template, as a JSON object. Default none.
	Data json.RawMessage
	// SendByWindow is how long after its tick a message may still be
	// delivered; later it expires. Default 0: no deadline.
	SendByWindow time.Duration
	// CatchUp is how old a tick missed while no worker ran may be and
	// still be sent when a worker starts; only the latest missed tick is.
	// Default DefaultCatchUp in a file; 0 turns catching up off.
	CatchUp time.Duration
}

// Default returns the default configuration: embedded Redis, the default
// worker settings, no policies, providers or campaigns.
func Default() *Config {
	return &Config{
		Redis: Redis{
			URL:          Embedded,
			EmbeddedAddr: DefaultEmbeddedAddr,
			Prefix:       DefaultPrefix,
		},
		Worker: Worker{
			Concurrency:     DefaultConcurrency,
			Queues:          map[string]int{DefaultQueue: 1},
			ShutdownTimeout: DefaultShutdownTimeout,
			HTTPAddr:        DefaultHTTPAddr,
			Dashboard:       Dashboard{Enabled: true, SecretEnv: DefaultDashboardSecretEnv},
			InlineWait:      DefaultInlineWait,
			Jitter:          DefaultJitter,
			SentMarks:       DefaultSentMarks,
			RememberTakes:   DefaultRememberTakes,
		},
		Policies:  map[string]Policy{},
		Providers: map[string]Provider{},
		Defaults:  Defaults{Queue: DefaultQueue},
	}
}

// Queues returns a copy of the queues and their priorities, as
// asynq.Config.Queues takes them.
func (c *Config) Queues() map[string]int {
	return maps.Clone(c.Worker.Queues)
}
