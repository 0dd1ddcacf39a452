// Package api is the HTTP API through which any service enqueues
// notifications: POST one or a batch, GET the tenant's list or where one
// stands, DELETE one not yet sent. A request carries an API key (config api.keys) that names the
// tenant its notifications are sent as and the policies and providers it
// may use; each key has a rate limit of its own, a token bucket of the
// throttle. A notification is the JSON object of a line of enqueue -file,
// decoded and checked by package intake, with the same messages; an error
// is {"error": {"code", "message", "field"}}, field a JSON pointer into the
// request body. The providers' feedback comes to /v1/feedback/{provider}
// (package feedback), signed by the vendor rather than with an API key.
// openapi.yaml documents every route; a test holds the two together.
package api

import (
	"cmp"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/feedback"
	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/throttle"
)

// Limits of a request.
const (
	// MaxBody is the most bytes of one notification's request body. The
	// task made of it must also fit jobs.MaxPayloadLen, with what the
	// config's defaults, the tenant and the time it was queued add: a body
	// within MaxBody whose task would not fit is a 413 naming /data.
	MaxBody = jobs.MaxPayloadLen
	// MaxBatchBody is the most bytes of a batch request's body.
	MaxBatchBody = 1 << 20
	// MaxBatch is the most notifications in one batch request.
	MaxBatch = 100
	// Timeout bounds a request's work in Redis: past it the API answers
	// 503 with Retry-After, whatever Redis does (down, the client's dials
	// retrying; hung, its reads waiting), so that a producer is told at
	// once rather than after the Redis client's own timeouts (3.5 s
	// refused, 40 s hung). A healthy Redis answers a request in
	// milliseconds. Work already sent may still be done after the 503: a
	// retry with the same Idempotency-Key is safe.
	Timeout = time.Second
	// BatchTimeout is Timeout for a batch and a list, which make up to a
	// few hundred round trips.
	BatchTimeout = 5 * time.Second
	// FeedbackTimeout is Timeout for a provider's feedback, which may
	// fetch SNS's signing certificate and its issuer, or confirm a
	// subscription (each within 5 s) besides a few round trips. The
	// vendors wait longer (SNS 15 s, Twilio 15 s).
	FeedbackTimeout = 10 * time.Second
	// MaxFeedbackBody is the most bytes of a provider's feedback request:
	// SendGrid batches its events up to 768 KB.
	MaxFeedbackBody = 1 << 20
)

// Options configure a Server.
type Options struct {
	Config *config.Config // api.keys, the names a notification may use, the prefix
	Redis  redis.UniversalClient
	// Limiter holds the keys' rate limits (a bucket per key, under the
	// config's prefix) and the workers' sent markers. Required.
	Limiter *throttle.Limiter
	// Metrics registers the API's metrics; nil registers none.
	Metrics prometheus.Registerer
	// Log gets the access log, one line per request; nil logs nothing.
	Log *slog.Logger
	// Events records the accepted and canceled events and reads the
	// histories; nil: a recorder of the config's events settings.
	Events *lifecycle.Recorder
}

// Server serves the API. It is safe for concurrent use.
type Server struct {
	// cfg is the config the server started with: its Redis prefix and
	// queues hold until a restart; keys and names are in live.
	cfg      *config.Config
	live     atomic.Pointer[setup]
	rdb      redis.UniversalClient
	client   *asynq.Client
	insp     *asynq.Inspector
	limiter  *throttle.Limiter
	sent     *jobs.SentMarks
	events   *lifecycle.Recorder
	feedback *feedback.Receiver
	metrics  *metrics
	log      *slog.Logger
	mux      *http.ServeMux
	// statuses are what each route, and "unrouted", may answer.
	statuses map[string][]int
}

// setup is what a config reload replaces (Server.Reload): the keys, and
// the names a notification may use.
type setup struct {
	cfg    *config.Config
	keys   []client
	check  intake.Checker
	queues []string // where a notification may be: the shards of the config's queues, sorted
}

// newSetup builds the keys and the checker of cfg.
func newSetup(cfg *config.Config) (*setup, error) {
	st := &setup{cfg: cfg, check: intake.Checker{Config: cfg, Name: "the config", KeyPerTenant: true},
		queues: asynqdb.Names(asynqdb.Served(cfg.Worker.Queues, cfg.Redis.Shards, nil))}
	keys, err := clients(cfg, st)
	if err != nil {
		return nil, err
	}
	st.keys = keys
	return st, nil
}

// New returns the API's server for the keys and names of opts.Config.
func New(opts Options) (*Server, error) {
	if opts.Limiter == nil {
		return nil, errors.New("api: Options.Limiter is required")
	}
	st, err := newSetup(opts.Config)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     opts.Config,
		rdb:     opts.Redis,
		client:  asynq.NewClientFromRedisClient(opts.Redis),
		insp:    asynq.NewInspectorFromRedisClient(opts.Redis),
		limiter: opts.Limiter,
		sent:    jobs.NewSentMarks(opts.Limiter),
		events:  cmp.Or(opts.Events, lifecycle.NewRecorder(opts.Redis, opts.Config.EventOptions())),
		metrics: newMetrics(opts.Metrics),
		log:     opts.Log,
		mux:     http.NewServeMux(),
	}
	// The providers' feedback blocks are read once, as the events' settings
	// are: a reload does not change them.
	if s.feedback, err = feedback.New(feedback.Options{Config: opts.Config, Redis: opts.Redis, Events: s.events,
		Metrics: feedback.NewMetrics(opts.Metrics), Log: opts.Log}); err != nil {
		return nil, err
	}
	s.live.Store(st)
	s.statuses = map[string][]int{"unrouted": Unrouted}
	for _, rt := range Routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt, s.handler(rt.Name)))
		s.statuses[rt.Name] = rt.Statuses
	}
	s.mux.HandleFunc("/", notRouted)
	return s, nil
}

// Reload makes cfg's API keys (with their tenants, rates and what each may
// use) and its policies, providers and defaults those of every request
// from now on, queues included: a SIGHUP's reload. Requests under way
// finish with what they started with. The Redis prefix and api.addr are
// the starting config's until a restart. On an error the running setup
// stays.
func (s *Server) Reload(cfg *config.Config) error {
	st, err := newSetup(cfg)
	if err != nil {
		return err
	}
	s.live.Store(st)
	return nil
}

// notRouted answers a request no route takes: 405 with the methods the
// path has, or 404.
func notRouted(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, rt := range Routes() {
		if matches(rt.Path, r.URL.Path) {
			allow = append(allow, rt.Method)
		}
	}
	if len(allow) == 0 {
		writeError(w, &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: "no such route: see openapi.yaml"})
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, &Error{Status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed,
		Message: r.Method + " is not a method of " + r.URL.Path + ": " + strings.Join(allow, ", ") + " are"})
}

// matches reports whether a path matches a route's pattern, in which
// "{name}" stands for one segment.
func matches(pattern, path string) bool {
	ps, segs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(segs) {
		return false
	}
	for i, p := range ps {
		if p != segs[i] && !(strings.HasPrefix(p, "{") && segs[i] != "") {
			return false
		}
	}
	return true
}

// Route is one of the API's routes: its method, path pattern (as
// net/http.ServeMux reads it), the statuses it answers with and how long
// its work in Redis may take.
type Route struct {
	Name     string
	Method   string
	Path     string
	Statuses []int
	Timeout  time.Duration
	// Signed: the request is signed by a provider (its feedback), and
	// carries no API key.
	Signed bool
}

// Unrouted are the statuses of a request no route takes (notRouted), as
// openapi.yaml's x-unrouted documents them; its metrics and access log
// name the route "unrouted".
var Unrouted = []int{http.StatusNotFound, http.StatusMethodNotAllowed}

// Routes returns the API's routes, as openapi.yaml documents them.
func Routes() []Route {
	post := []int{400, 401, 403, 413, 415, 429, 503}
	signed := []int{200, 400, 403, 404, 409, 413, 503}
	return []Route{
		{Name: "enqueue", Method: http.MethodPost, Path: "/v1/notifications", Statuses: append([]int{200, 202, 409}, post...), Timeout: Timeout},
		{Name: "list", Method: http.MethodGet, Path: "/v1/notifications", Statuses: []int{200, 400, 401, 429, 503}, Timeout: BatchTimeout},
		{Name: "batch", Method: http.MethodPost, Path: "/v1/notifications/batch", Statuses: append([]int{200}, post...), Timeout: BatchTimeout},
		{Name: "get", Method: http.MethodGet, Path: "/v1/notifications/{id}", Statuses: []int{200, 401, 404, 429, 503}, Timeout: Timeout},
		{Name: "cancel", Method: http.MethodDelete, Path: "/v1/notifications/{id}", Statuses: []int{200, 401, 404, 409, 429, 503}, Timeout: Timeout},
		{Name: "feedback", Method: http.MethodPost, Path: feedback.Path + "{provider}", Statuses: signed, Timeout: FeedbackTimeout, Signed: true},
		{Name: "replies", Method: http.MethodPost, Path: feedback.Path + "{provider}/inbound", Statuses: signed, Timeout: FeedbackTimeout, Signed: true},
	}
}

func (s *Server) handler(name string) handlerFunc {
	switch name {
	case "enqueue":
		return s.enqueueOne
	case "list":
		return s.list
	case "batch":
		return s.enqueueBatch
	case "get":
		return s.get
	case "cancel":
		return s.cancel
	case "feedback":
		return s.receive(false)
	case "replies":
		return s.receive(true)
	}
	panic("api: no handler for route " + name) // a route added without one
}
