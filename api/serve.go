package api

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/notify-throttle/throttler/internal/timefmt"
)

// RequestIDHeader carries a request's ID on every answer, and in the
// access log: the caller's, if well-formed (wellFormedID), else a new one.
const RequestIDHeader = "Request-Id"

// handlerFunc serves a route's request for an authenticated client (nil
// for a Signed route) and returns what its access log line adds, or the
// error to answer.
type handlerFunc func(s *Server, w http.ResponseWriter, r *http.Request, c *client) (logged, error)

// logged is what a handler adds to its request's access log line.
type logged struct {
	id, recipient string
	count         int
}

// exchange is what one request's access log line and metrics learn while
// it is served, filled in on the goroutine that serves it.
type exchange struct {
	route      string // "unrouted" when no route took it
	key        string // the API key's name, once authenticated
	recipients bool   // the recipient may be logged (api.log_recipients)
	what       logged
}

type exchangeKey struct{}

// ServeHTTP serves the API's routes, and logs and counts every answer.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := requestID(r)
	w.Header().Set(RequestIDHeader, id)
	ex := &exchange{route: "unrouted"}
	buf := &buffer{header: w.Header()} // its status is logged and counted before it goes
	if r.URL.Path != path.Clean(r.URL.Path) || r.URL.Path == "" {
		notRouted(buf, r) // the mux would redirect to the clean path: no route has this one
	} else {
		s.mux.ServeHTTP(buf, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex)))
	}
	status := cmp.Or(buf.status, http.StatusOK)
	elapsed := time.Since(start)
	s.metrics.observe(ex.route, status, elapsed)
	if !slices.Contains(s.statuses[ex.route], status) && s.log != nil {
		s.log.Error("api: a status openapi.yaml does not list", "route", ex.route, "status", status)
	}
	s.access(r.Context(), id, ex, status, elapsed)
	buf.copyTo(w)
}

// wrap authenticates a request for route rt (by its API key, unless the
// route is Signed) and serves it within rt.Timeout.
func (s *Server) wrap(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ex, _ := r.Context().Value(exchangeKey{}).(*exchange)
		if ex == nil { // served other than by ServeHTTP: nothing is logged
			ex = &exchange{}
		}
		ex.route = rt.Name
		var c *client
		if !rt.Signed { // else the handler checks the provider's signature
			var err error
			if c, err = s.live.Load().authenticate(r); err != nil {
				writeError(w, err)
				return
			}
			ex.key, ex.recipients = c.name, c.setup.cfg.API.LogRecipients
		}
		ex.what = bounded(w, r, rt.Timeout, func(w http.ResponseWriter, r *http.Request) logged {
			what, err := rt.serve(s, w, r, c)
			if err != nil {
				writeError(w, err)
			}
			return what
		})
	})
}

// bounded runs h with a deadline d on its request's context, its answer
// buffered. Past d it answers 503 and leaves h to finish on its own, its
// answer dropped.
func bounded(w http.ResponseWriter, r *http.Request, d time.Duration, h func(http.ResponseWriter, *http.Request) logged) logged {
	ctx, cancel := context.WithTimeout(r.Context(), d)
	type result struct {
		what  logged
		panic any
	}
	done := make(chan result, 1)
	buf := &buffer{header: http.Header{}}
	go func() {
		defer cancel()
		defer func() {
			if p := recover(); p != nil {
				done <- result{panic: p}
			}
		}()
		done <- result{what: h(buf, r.WithContext(ctx))}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		select {
		case res = <-done: // h returned, and its cancel ended ctx
		default:
			writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, RetryAfter: time.Second,
				Message: fmt.Sprintf("the queue did not answer within %s: try again", timefmt.Duration(d))})
			return logged{}
		}
	}
	if res.panic != nil {
		panic(res.panic) // as if h had run here: net/http logs it
	}
	buf.copyTo(w)
	return res.what
}

// access writes the request's access log line: recipients only with
// api.log_recipients.
func (s *Server) access(ctx context.Context, id string, ex *exchange, status int, elapsed time.Duration) {
	if s.log == nil {
		return
	}
	attrs := []slog.Attr{slog.String("route", ex.route), slog.Int("status", status),
		slog.String("took", strconv.FormatFloat(elapsed.Seconds()*1000, 'f', 1, 64)+"ms"), slog.String("request_id", id)}
	if ex.key != "" {
		attrs = append(attrs, slog.String("key", ex.key))
	}
	if ex.what.id != "" {
		attrs = append(attrs, slog.String("id", ex.what.id))
	}
	if ex.what.count > 0 {
		attrs = append(attrs, slog.Int("count", ex.what.count))
	}
	if ex.what.recipient != "" && ex.recipients {
		attrs = append(attrs, slog.String("recipient", ex.what.recipient))
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "api", attrs...)
}

// wellFormedID matches a request ID a log line and a header carry as it is.
var wellFormedID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// requestID returns the well-formed ID the request brings, else a new one.
func requestID(r *http.Request) string {
	for _, h := range []string{RequestIDHeader, "X-Request-Id"} {
		if id := r.Header.Get(h); wellFormedID.MatchString(id) {
			return id
		}
	}
	return uuid.NewString()
}

// buffer is a ResponseWriter that keeps the answer until copyTo.
type buffer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *buffer) Header() http.Header { return b.header }

func (b *buffer) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *buffer) Write(p []byte) (int, error) { return b.body.Write(p) }

// copyTo writes the kept answer to w.
func (b *buffer) copyTo(w http.ResponseWriter) {
	maps.Copy(w.Header(), b.header)
	if b.status != 0 {
		w.WriteHeader(b.status)
	}
	_, _ = w.Write(b.body.Bytes())
}
