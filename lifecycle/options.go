package lifecycle

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// Defaults of Options and Endpoint.
const (
	// DefaultHistory keeps a history long after asynq (at once, without an
	// idempotency key) and the sent marker (an hour) forgot the message.
	DefaultHistory = 7 * 24 * time.Hour
	// DefaultHistoryLimit: a message is booked, deferred and retried far
	// fewer times.
	DefaultHistoryLimit = 100
	DefaultBackoff      = 10 * time.Second
	DefaultMaxBackoff   = 10 * time.Minute
	// DefaultGiveUp is Stripe's: three days, a long weekend of an endpoint down.
	DefaultGiveUp   = 72 * time.Hour
	DefaultTimeout  = 5 * time.Second
	DefaultParallel = 8
	// DefaultLeaseMargin is how long past its timeout a POST is surely
	// over, so that another worker may take its event.
	DefaultLeaseMargin = time.Second
	DefaultPoll        = time.Second
)

// Options configure a Recorder and a Dispatcher; config.Config.Events
// builds them from the file. The zero value of a field means its default.
type Options struct {
	Prefix  string        // the throttle's; default keyspace.DefaultPrefix
	History time.Duration // a history's life after its first event
	// HistoryLimit is the most events a history keeps: its first and the
	// latest; at least 2.
	HistoryLimit int
	// Callbacks are the endpoints by tenant ("" the default tenant): only
	// these tenants' events are POSTed.
	Callbacks map[string]Endpoint
	// Backoff is the wait before a failed POST's first retry, doubled after
	// each up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
	GiveUp              time.Duration // an older event is dropped, logged and counted
	Parallel            int           // POSTs under way per endpoint
	LeaseMargin, Poll   time.Duration // tests shorten them
	// Consumer names a Dispatcher in the streams' group; default
	// "<host>/<pid>/<random>".
	Consumer string
	Log      *slog.Logger // failed POSTs, events given up; default slog.Default()
	Metrics  *Metrics     // nil: metrics registered nowhere
}

// Endpoint is where a tenant's events are POSTed.
type Endpoint struct {
	URL     string // http:// or https://
	Secret  string // signs every POST (Sign); never logged
	Timeout time.Duration
}

func (o Options) withDefaults() Options {
	o.Prefix = cmp.Or(o.Prefix, keyspace.DefaultPrefix)
	o.History = positive(o.History, DefaultHistory)
	if o.HistoryLimit < 2 {
		o.HistoryLimit = DefaultHistoryLimit
	}
	o.Backoff = positive(o.Backoff, DefaultBackoff)
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(o.Backoff, DefaultMaxBackoff)
	}
	o.GiveUp = positive(o.GiveUp, DefaultGiveUp)
	o.Parallel = positive(o.Parallel, DefaultParallel)
	o.LeaseMargin = positive(o.LeaseMargin, DefaultLeaseMargin)
	o.Poll = positive(o.Poll, DefaultPoll)
	o.Log = cmp.Or(o.Log, slog.Default())
	o.Metrics = cmp.Or(o.Metrics, NewMetrics(nil))
	return o
}

func (e Endpoint) timeout() time.Duration { return positive(e.Timeout, DefaultTimeout) }

// positive returns v, or def if v is not positive.
func positive[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
