package lifecycle

import (
	"log/slog"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// Defaults of Options and Endpoint.
const (
	// DefaultHistory keeps a history a week after it began (its message
	// was accepted): long after asynq has forgotten a message without an
	// idempotency key (at once) and the sent marker has (an hour), so
	// that GET still tells.
	// A history of three events takes about 0.8 KB of Redis memory.
	DefaultHistory = 7 * 24 * time.Hour
	// DefaultHistoryLimit bounds a history to its first event and the 99
	// latest: a message is booked, deferred and retried far fewer times.
	DefaultHistoryLimit = 100
	// DefaultBackoff is the wait before the first retry of a failed POST,
	// doubled after each retry up to DefaultMaxBackoff.
	DefaultBackoff    = 10 * time.Second
	DefaultMaxBackoff = 10 * time.Minute
	// DefaultGiveUp is how long an event is retried, as Stripe's
	// webhooks are: three days, a long weekend of an endpoint down.
	DefaultGiveUp = 72 * time.Hour
	// DefaultTimeout bounds one POST.
	DefaultTimeout = 5 * time.Second
	// DefaultParallel is how many POSTs a Dispatcher has under way per
	// endpoint.
	DefaultParallel = 8
	// DefaultLeaseMargin is how long past its timeout a POST is taken to
	// be over: an event read longer ago than its timeout and this, and not
	// acknowledged, is no longer being POSTed (its worker died, or the POST
	// failed), and another worker may take it.
	DefaultLeaseMargin = time.Second
	// DefaultPoll is the longest a Dispatcher waits for new events before
	// it looks for retries that are due.
	DefaultPoll = time.Second
)

// Options configure a Recorder and a Dispatcher; config.Config.Events
// builds them from the file. The zero value of a field means its default.
type Options struct {
	// Prefix starts every key: the throttle's. Default
	// keyspace.DefaultPrefix.
	Prefix string
	// History is how long a message's history lives after its first event
	// (its accepted event, as a rule). Default DefaultHistory.
	History time.Duration
	// HistoryLimit is the most events a history keeps: its first and the
	// latest. At least 2; default DefaultHistoryLimit.
	HistoryLimit int
	// Callbacks are the tenants' endpoints, by tenant ("" is the default
	// tenant): the events of these tenants' messages are POSTed, and none
	// of the others'.
	Callbacks map[string]Endpoint
	// Backoff is the wait before the first retry of an event whose POST
	// failed, doubled after each retry up to MaxBackoff. Defaults
	// DefaultBackoff and DefaultMaxBackoff.
	Backoff, MaxBackoff time.Duration
	// GiveUp is how old an event may be and still be POSTed: an older one
	// is dropped, logged and counted. Default DefaultGiveUp.
	GiveUp time.Duration
	// Parallel is how many POSTs a Dispatcher has under way per endpoint.
	// Default DefaultParallel.
	Parallel int
	// LeaseMargin is DefaultLeaseMargin's; Poll DefaultPoll's. Tests
	// shorten them.
	LeaseMargin, Poll time.Duration
	// Consumer names a Dispatcher in its streams' consumer group. Default
	// "<host>/<pid>/<random>", a name of its own for each process.
	Consumer string
	// Log gets what goes wrong (a POST that failed, an event given up).
	// Default slog.Default().
	Log *slog.Logger
	// Metrics counts events and callbacks; nil counts on metrics
	// registered nowhere.
	Metrics *Metrics
}

// Endpoint is where a tenant's events are POSTed.
type Endpoint struct {
	URL string // http:// or https://
	// Secret signs every POST (see Sign); it is never logged.
	Secret string
	// Timeout bounds one POST. Default DefaultTimeout.
	Timeout time.Duration
}

// withDefaults returns o with its defaults filled in.
func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = keyspace.DefaultPrefix
	}
	if o.History <= 0 {
		o.History = DefaultHistory
	}
	if o.HistoryLimit < 2 {
		o.HistoryLimit = DefaultHistoryLimit
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(o.Backoff, DefaultMaxBackoff)
	}
	if o.GiveUp <= 0 {
		o.GiveUp = DefaultGiveUp
	}
	if o.Parallel <= 0 {
		o.Parallel = DefaultParallel
	}
	if o.LeaseMargin <= 0 {
		o.LeaseMargin = DefaultLeaseMargin
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	return o
}

// timeout is e's Timeout, or DefaultTimeout.
func (e Endpoint) timeout() time.Duration {
	if e.Timeout > 0 {
		return e.Timeout
	}
	return DefaultTimeout
}
