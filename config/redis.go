package config

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Redacted replaces a password in what RedactURL returns.
const Redacted = "xxxxx"

// IsEmbedded reports whether r runs the in-process server (url: embedded).
func (r Redis) IsEmbedded() bool { return r.URL == Embedded && len(r.Cluster) == 0 }

// String describes where r connects, for logs, with the password redacted:
// "embedded (127.0.0.1:6390)", "redis://app:xxxxx@cache:6379/0" or
// "cluster 10.0.0.1:7000,10.0.0.2:7000".
func (r Redis) String() string {
	switch {
	case len(r.Cluster) > 0:
		return "cluster " + strings.Join(r.Cluster, ",")
	case r.IsEmbedded():
		return Embedded + " (" + r.EmbeddedAddr + ")"
	}
	return RedactURL(r.URL)
}

// Connect returns a client of the Redis r names, after a PING has answered
// within ctx, and the function that closes it. It never starts a server:
// with url: embedded it connects to the embedded server of a worker (see
// Serve) on EmbeddedAddr, which is what a separate enqueue process needs.
//
// The client is a *redis.Client, or a *redis.ClusterClient for a cluster.
// To run asynq on it, pass it to asynq.NewClientFromRedisClient,
// NewServerFromRedisClient or NewInspectorFromRedisClient; asynq does not
// close such a client, so call close after shutting asynq down.
func (r Redis) Connect(ctx context.Context) (rdb redis.UniversalClient, close func() error, err error) {
	switch {
	case len(r.Cluster) > 0:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.Cluster})
	case r.IsEmbedded():
		rdb = redis.NewClient(&redis.Options{Addr: r.EmbeddedAddr})
	default:
		if msg := checkRedisURL(r.URL); msg != "" {
			return nil, nil, fmt.Errorf("config: redis.url: %s", msg)
		}
		opts, err := parseRedisURL(r.URL)
		if err != nil {
			return nil, nil, fmt.Errorf("config: redis.url: %s", err)
		}
		rdb = redis.NewClient(opts)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		hint := ""
		if r.IsEmbedded() {
			hint = " (a worker runs the embedded server: start one first)"
		}
		msg := fmt.Sprintf("config: connect to redis %s%s: %s", r, hint, scrub(err.Error(), r.URL))
		return nil, nil, &scrubbedError{msg: msg, err: err}
	}
	return rdb, onceFunc(rdb.Close), nil
}

// Serve is Connect for the process that owns the data, the worker: with
// url: embedded it first starts the in-process server on EmbeddedAddr (an
// error if that address is taken, by another worker for instance), and close
// stops it after closing the client. Otherwise it is Connect. Embedded data
// lives in memory only and is lost when the server stops; ctx bounds the
// start, not the server's life.
func (r Redis) Serve(ctx context.Context) (rdb redis.UniversalClient, close func() error, err error) {
	if !r.IsEmbedded() {
		return r.Connect(ctx)
	}
	srv, err := startEmbedded(r.EmbeddedAddr)
	if err != nil {
		return nil, nil, err
	}
	rdb, closeClient, err := r.Connect(ctx)
	if err != nil {
		srv.close()
		return nil, nil, err
	}
	return rdb, onceFunc(func() error {
		err := closeClient()
		srv.close()
		return err
	}), nil
}

// scrubbedError is an error whose text had a password taken out; errors.Is
// and errors.As still see the cause.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// onceFunc makes close safe to call more than once.
func onceFunc(f func() error) func() error {
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { err = f() })
		return err
	}
}

// checkRedisURL returns what is wrong with a redis.url, or "".
func checkRedisURL(u string) string {
	if u == Embedded {
		return ""
	}
	scheme, _, ok := strings.Cut(u, "://")
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		if !ok {
			break
		}
		if _, err := parseRedisURL(u); err != nil {
			return err.Error()
		}
		return ""
	}
	return fmt.Sprintf("must be %s or a redis://, rediss:// or unix:// URL (got %s)", Embedded, quote(RedactURL(u)))
}

// parseRedisURL is redis.ParseURL with errors that quote the URL redacted
// and never its password: net/url's errors echo the whole URL, so they are
// replaced, and go-redis's are scrubbed.
func parseRedisURL(u string) (*redis.Options, error) {
	opts, err := redis.ParseURL(u)
	if err == nil {
		return opts, nil
	}
	msg := "not a valid URL"
	var ue *url.Error
	if !errors.As(err, &ue) {
		msg = scrub(strings.TrimPrefix(err.Error(), "redis: "), u)
	}
	return nil, fmt.Errorf("%s (got %s)", msg, quote(RedactURL(u)))
}

// RedactURL returns u with its password, if any, replaced by xxxxx:
// "redis://app:s3cret@cache:6379/0" becomes "redis://app:xxxxx@cache:6379/0".
// It works on the text, so it also hides the password of a URL that does
// not parse (one with an unescaped '/' or '@' in it, say), erring on the
// side of hiding too much; query parameters whose name contains "pass" are
// hidden too. Every log line and error that shows a Redis URL uses it.
func RedactURL(u string) string {
	var b strings.Builder
	last := 0
	for _, s := range secretSpans(u) {
		b.WriteString(u[last:s[0]])
		b.WriteString(Redacted)
		last = s[1]
	}
	b.WriteString(u[last:])
	return b.String()
}

// secretSpans returns the [start, end) byte ranges of u's secrets, in order:
// the password (between the first ':' of the part after "://" and its last
// '@') and the values of query parameters named like a password.
func secretSpans(u string) [][2]int {
	var spans [][2]int
	start := 0
	if i := strings.Index(u, "://"); i >= 0 {
		start = i + 3
	}
	at := strings.LastIndexByte(u[start:], '@')
	if at >= 0 {
		at += start
		if colon := strings.IndexByte(u[start:at], ':'); colon >= 0 {
			spans = append(spans, [2]int{start + colon + 1, at})
			start = at
		}
	}
	if q := strings.IndexByte(u[start:], '?'); q >= 0 {
		for i := start + q + 1; i < len(u); {
			end := strings.IndexAny(u[i:], "&;#")
			if end < 0 {
				end = len(u)
			} else {
				end += i
			}
			if name, _, ok := strings.Cut(u[i:end], "="); ok && strings.Contains(strings.ToLower(name), "pass") {
				spans = append(spans, [2]int{i + len(name) + 1, end})
			}
			if end < len(u) && u[end] == '#' {
				break
			}
			i = end + 1
		}
	}
	return spans
}

// scrub hides any of u's secrets that appear in msg, decoded or not.
func scrub(msg, u string) string {
	for _, s := range secretSpans(u) {
		secret := u[s[0]:s[1]]
		if secret == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, secret, Redacted)
		if dec, err := url.PathUnescape(secret); err == nil && dec != "" {
			msg = strings.ReplaceAll(msg, dec, Redacted)
		}
		if dec, err := url.QueryUnescape(secret); err == nil && dec != "" {
			msg = strings.ReplaceAll(msg, dec, Redacted)
		}
	}
	return msg
}
