// Package api is the HTTP API through which any service enqueues
// notifications, follows them and cancels them, and through which the
// providers' services report (package feedback). docs/operations.md#the-http-api
// explains it; openapi.yaml documents every route, and a test holds the two
// together. A notification is decoded and checked by package intake.
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
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// Limits of a request (docs/operations.md#the-http-api, "Limits").
const (
	MaxBody         = message.MaxPayloadLen // one notification's body; its task must fit too
	MaxBatchBody    = 1 << 20               // a batch's body
	MaxBatch        = 100                   // notifications in a batch
	Timeout         = time.Second           // a request's work in Redis, past which it is a 503
	BatchTimeout    = 5 * time.Second       // Timeout for a batch and a list, a few hundred round trips
	FeedbackTimeout = 10 * time.Second      // for feedback, which may fetch SNS's certificates (5 s each); the vendors wait 15 s
	MaxFeedbackBody = 1 << 20               // SendGrid batches its events up to 768 KB
)

// Options configure a Server.
type Options struct {
	Config *config.Config // api.keys, the names a notification may use, the prefix
	Redis  redis.UniversalClient
	// Limiter holds the keys' rate limits and the workers' sent markers. Required.
	Limiter *throttle.Limiter
	Metrics prometheus.Registerer // nil registers none
	Log     *slog.Logger          // the access log; nil logs nothing
	// Events records and reads the messages' events; nil: a recorder of
	// the config's events settings.
	Events *lifecycle.Recorder
}

// Server serves the API. It is safe for concurrent use.
type Server struct {
	cfg      *config.Config // the starting config: its Redis prefix holds until a restart
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
	statuses map[string][]int // what each route, and "unrouted", may answer
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
	var err error
	if st.keys, err = clients(cfg, st); err != nil {
		return nil, err
	}
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
	// The feedback blocks are read once: a reload does not change them.
	if s.feedback, err = feedback.New(feedback.Options{Config: opts.Config, Redis: opts.Redis, Events: s.events,
		Metrics: feedback.NewMetrics(opts.Metrics), Log: opts.Log}); err != nil {
		return nil, err
	}
	s.live.Store(st)
	s.statuses = map[string][]int{"unrouted": Unrouted}
	for _, rt := range Routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
		s.statuses[rt.Name] = rt.Statuses
	}
	s.mux.HandleFunc("/", notRouted)
	return s, nil
}

// Reload makes cfg's API keys, policies, providers, defaults and queues
// those of every request from now on (a SIGHUP); requests under way finish
// with what they started with. On an error the running setup stays.
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
	Signed   bool // signed by a provider (its feedback) rather than carrying an API key
	serve    handlerFunc
}

// Unrouted are the statuses of a request no route takes (notRouted), as
// openapi.yaml's x-unrouted documents them.
var Unrouted = []int{http.StatusNotFound, http.StatusMethodNotAllowed}

// Routes returns the API's routes, as openapi.yaml documents them.
func Routes() []Route {
	post := []int{400, 401, 403, 413, 415, 429, 503}
	signed := []int{200, 400, 403, 404, 409, 413, 503}
	return []Route{
		{Name: "enqueue", Method: http.MethodPost, Path: "/v1/notifications", Statuses: append([]int{200, 202, 409}, post...), Timeout: Timeout, serve: (*Server).enqueueOne},
		{Name: "list", Method: http.MethodGet, Path: "/v1/notifications", Statuses: []int{200, 400, 401, 429, 503}, Timeout: BatchTimeout, serve: (*Server).list},
		{Name: "batch", Method: http.MethodPost, Path: "/v1/notifications/batch", Statuses: append([]int{200}, post...), Timeout: BatchTimeout, serve: (*Server).enqueueBatch},
		{Name: "get", Method: http.MethodGet, Path: "/v1/notifications/{id}", Statuses: []int{200, 401, 404, 429, 503}, Timeout: Timeout, serve: (*Server).get},
		{Name: "cancel", Method: http.MethodDelete, Path: "/v1/notifications/{id}", Statuses: []int{200, 401, 404, 409, 429, 503}, Timeout: Timeout, serve: (*Server).cancel},
		{Name: "feedback", Method: http.MethodPost, Path: feedback.Path + "{provider}", Statuses: signed, Timeout: FeedbackTimeout, Signed: true, serve: receive(false)},
		{Name: "replies", Method: http.MethodPost, Path: feedback.Path + "{provider}/inbound", Statuses: signed, Timeout: FeedbackTimeout, Signed: true, serve: receive(true)},
	}
}
