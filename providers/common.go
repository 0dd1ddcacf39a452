package providers

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/jobs"
)

// DefaultTimeout bounds a send when Settings.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultScopePause is how long a scoped throttle that names no moment
// (APNs' 429 per device, Twilio's 14107 per pair) holds its scope when
// Settings.ScopePause is zero.
const DefaultScopePause = time.Minute

// Settings are what every adapter takes; the zero value of each field means
// its default.
type Settings struct {
	Name       string        // the provider's name in the config, for errors
	Timeout    time.Duration // per send; default DefaultTimeout
	ScopePause time.Duration // default DefaultScopePause
	// BaseURL replaces the service's address (tests, a regional endpoint,
	// a proxy); default the service's own.
	BaseURL string
	// RootCAs, if set, are the CAs the provider's TLS trusts (its ca_file's
	// with the system's); default the system's.
	RootCAs *x509.CertPool
	// Transport, if set, carries the requests (tests: a loopback TLS
	// server's); default a clone of http.DefaultTransport (HTTP/2 over TLS)
	// trusting RootCAs.
	Transport http.RoundTripper
}

func (s Settings) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return DefaultTimeout
}

func (s Settings) scopePause() time.Duration {
	if s.ScopePause > 0 {
		return s.ScopePause
	}
	return DefaultScopePause
}

// base returns BaseURL, else def, without a trailing slash.
func (s Settings) base(def string) string {
	if s.BaseURL != "" {
		return strings.TrimRight(s.BaseURL, "/")
	}
	return def
}

// httpClient is a client of its own transport (see Transport) bounded by
// the settings' timeout, which follows no redirects (an API that
// redirects is misconfigured).
func (s Settings) httpClient() *http.Client {
	tr := s.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone() // still HTTP/2: ForceAttemptHTTP2
		if s.RootCAs != nil {
			t.TLSClientConfig = &tls.Config{RootCAs: s.RootCAs}
		}
		tr = t
	}
	return &http.Client{Timeout: s.timeout(), Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Content is a message's template data as the adapters read it (see
// docs/providers.md): subject and body (and html) for email, body for SMS,
// title, body and data for push.
type Content struct {
	Subject string            `json:"subject"`
	Title   string            `json:"title"`
	Body    string            `json:"body"`
	HTML    string            `json:"html"`
	Data    map[string]string `json:"data"`
}

// content decodes m's data; a message whose data does not fit is Reject.
func content(provider string, m jobs.Message) (Content, error) {
	var c Content
	if len(m.Data) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(m.Data, &c); err != nil {
		return c, reject("%s: data: %v", provider, err)
	}
	return c, nil
}

// redact makes *err show the recipient only redacted: every adapter's
// Send defers it (see jobs.RedactError).
func redact(err *error, recipient string) { *err = jobs.RedactError(*err, recipient) }

// result builders: one per class of jobs.SendError.
func reject(format string, args ...any) error {
	return &jobs.SendError{Outcome: jobs.Reject, Err: fmt.Errorf(format, args...)}
}

func dead(format string, args ...any) error {
	return &jobs.SendError{Outcome: jobs.Dead, Err: fmt.Errorf(format, args...)}
}

func broken(format string, args ...any) error {
	return &jobs.SendError{Outcome: jobs.Broken, Err: fmt.Errorf(format, args...)}
}

func pause(after time.Duration, at time.Time, scope string, format string, args ...any) error {
	return &jobs.SendError{Outcome: jobs.Pause, RetryAfter: after, RetryAt: at, Scope: scope, Err: fmt.Errorf(format, args...)}
}

func retryAt(after time.Duration, at time.Time, format string, args ...any) error {
	return &jobs.SendError{Outcome: jobs.Retry, RetryAfter: after, RetryAt: at, Err: fmt.Errorf(format, args...)}
}

// retryAfter reads a Retry-After header: seconds or an HTTP date, as a wait
// or a moment; def when absent or unreadable.
func retryAfter(h string, def time.Duration) (time.Duration, time.Time) {
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return max(time.Duration(n)*time.Second, time.Millisecond), time.Time{}
	}
	if t, err := http.ParseTime(h); err == nil {
		return 0, t
	}
	return def, time.Time{}
}

// epoch reads a header of Unix seconds (X-RateLimit-Reset) as a moment.
func epoch(h string) (time.Time, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// do sends req and returns the status, headers and up to 64 KiB
// of the body, having drained the rest so the connection is reused.
func do(c *http.Client, req *http.Request) (int, http.Header, []byte, error) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, body, nil
}

// snippet is the start of a body, for an error message.
func snippet(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 300 {
		b = b[:300]
	}
	return string(b)
}
