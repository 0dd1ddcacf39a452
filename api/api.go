// Package api is the HTTP API through which any service enqueues
// notifications: POST one or a batch, GET where one stands, DELETE one not
// yet sent. A request carries an API key (config api.keys) that names the
// tenant its notifications are sent as and the policies and providers it
// may use; each key has a rate limit of its own, a token bucket of the
// throttle. A notification is the JSON object of a line of enqueue -file,
// decoded and checked by package intake, with the same messages; an error
// is {"error": {"code", "message", "field"}}, field a JSON pointer into the
// request body. openapi.yaml documents every route; a test holds the two
// together.
package api

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/throttle"
)

// Limits of a request.
const (
	// MaxBody is the most bytes of one notification's request body: a
	// task's whole payload is at most jobs.MaxPayloadLen.
	MaxBody = jobs.MaxPayloadLen
	// MaxBatchBody is the most bytes of a batch request's body.
	MaxBatchBody = 1 << 20
	// MaxBatch is the most notifications in one batch request.
	MaxBatch = 100
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
	cfg     *config.Config
	rdb     redis.UniversalClient
	client  *asynq.Client
	insp    *asynq.Inspector
	check   intake.Checker
	keys    []client
	limiter *throttle.Limiter
	sent    *jobs.SentMarks
	events  *lifecycle.Recorder
	metrics *metrics
	log     *slog.Logger
	mux     *http.ServeMux
}

// New returns the API's server for the keys and names of opts.Config.
func New(opts Options) (*Server, error) {
	if opts.Limiter == nil {
		return nil, errors.New("api: Options.Limiter is required")
	}
	keys, err := clients(opts.Config)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     opts.Config,
		rdb:     opts.Redis,
		client:  asynq.NewClientFromRedisClient(opts.Redis),
		insp:    asynq.NewInspectorFromRedisClient(opts.Redis),
		check:   intake.Checker{Config: opts.Config, Name: "the config"},
		keys:    keys,
		limiter: opts.Limiter,
		sent:    jobs.NewSentMarks(opts.Limiter),
		events:  cmp.Or(opts.Events, lifecycle.NewRecorder(opts.Redis, opts.Config.EventOptions())),
		metrics: newMetrics(opts.Metrics),
		log:     opts.Log,
		mux:     http.NewServeMux(),
	}
	for _, rt := range Routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt, s.handler(rt.Name)))
	}
	s.mux.HandleFunc("/", notRouted)
	return s, nil
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

// ServeHTTP serves the API's routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Route is one of the API's routes: its method, path pattern (as
// net/http.ServeMux reads it) and the statuses it answers with.
type Route struct {
	Name     string
	Method   string
	Path     string
	Statuses []int
}

// Routes returns the API's routes, as openapi.yaml documents them.
func Routes() []Route {
	common := []int{400, 401, 403, 413, 429, 503}
	return []Route{
		{Name: "enqueue", Method: http.MethodPost, Path: "/v1/notifications", Statuses: append([]int{200, 202, 409}, common...)},
		{Name: "batch", Method: http.MethodPost, Path: "/v1/notifications/batch", Statuses: append([]int{200}, common...)},
		{Name: "get", Method: http.MethodGet, Path: "/v1/notifications/{id}", Statuses: []int{200, 401, 404, 429, 503}},
		{Name: "cancel", Method: http.MethodDelete, Path: "/v1/notifications/{id}", Statuses: []int{200, 401, 404, 409, 429, 503}},
	}
}

func (s *Server) handler(name string) func(http.ResponseWriter, *http.Request, *client) (int, logged) {
	switch name {
	case "enqueue":
		return s.enqueueOne
	case "batch":
		return s.enqueueBatch
	case "get":
		return s.get
	case "cancel":
		return s.cancel
	}
	panic("api: no handler for route " + name) // a route added without one
}

// logged is what a handler adds to its request's access log line.
type logged struct {
	id, recipient string
	count         int
}

// wrap authenticates a request, runs h and records the request in the
// metrics and the access log.
func (s *Server) wrap(rt Route, h func(http.ResponseWriter, *http.Request, *client) (int, logged)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var status int
		var what logged
		c, err := s.authenticate(r)
		if err != nil {
			status = writeError(w, err)
		} else {
			status, what = h(w, r, c)
		}
		elapsed := time.Since(start)
		s.metrics.observe(rt.Name, status, elapsed)
		if !slices.Contains(rt.Statuses, status) && s.log != nil {
			s.log.Error("api: a status openapi.yaml does not list", "route", rt.Name, "status", status)
		}
		s.access(r.Context(), rt, c, status, elapsed, what)
	})
}

// access writes the request's access log line: recipients only with
// api.log_recipients.
func (s *Server) access(ctx context.Context, rt Route, c *client, status int, elapsed time.Duration, what logged) {
	if s.log == nil {
		return
	}
	attrs := []slog.Attr{slog.String("route", rt.Name), slog.Int("status", status),
		slog.String("took", strconv.FormatFloat(elapsed.Seconds()*1000, 'f', 1, 64)+"ms")}
	if c != nil {
		attrs = append(attrs, slog.String("key", c.name))
	}
	if what.id != "" {
		attrs = append(attrs, slog.String("id", what.id))
	}
	if what.count > 0 {
		attrs = append(attrs, slog.Int("count", what.count))
	}
	if what.recipient != "" && s.cfg.API.LogRecipients {
		attrs = append(attrs, slog.String("recipient", what.recipient))
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "api", attrs...)
}
