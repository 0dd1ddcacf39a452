package providers

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds a send when Settings.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultScopePause is how long a throttle that names no moment (APNs'
// 429s, a Twilio sender's queue overflow) holds its scope.
const DefaultScopePause = time.Minute

// Settings are what every adapter takes; the zero value of each field means
// its default.
type Settings struct {
	Name       string         // the provider's name in the config, for errors
	Timeout    time.Duration  // per send; default DefaultTimeout
	ScopePause time.Duration  // default DefaultScopePause
	BaseURL    string         // replaces the service's address (tests, a region, a proxy)
	RootCAs    *x509.CertPool // the CAs TLS trusts (ca_file's with the system's); default the system's
	// Transport carries the requests (tests: a loopback TLS server's);
	// default a clone of http.DefaultTransport trusting RootCAs.
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

// httpClient is a client bounded by the timeout that follows no redirects
// (an API that redirects is misconfigured).
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

// Content is a message's template data as the adapters read it
// (docs/providers.md#template-data).
type Content struct {
	Subject string            `json:"subject"`
	Title   string            `json:"title"`
	Body    string            `json:"body"`
	HTML    string            `json:"html"`
	Data    map[string]string `json:"data"`
}

// content decodes m's data; data that does not fit is Reject.
func content(provider string, m Message) (Content, error) {
	var c Content
	if len(m.Data) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(m.Data, &c); err != nil {
		return c, reject("%s: data: %v", provider, err)
	}
	return c, nil
}

// redact makes *err show the recipient only redacted: every Send defers it.
func redact(err *error, recipient string) { *err = RedactError(*err, recipient) }

// One builder per class of SendError.
func reject(format string, args ...any) error {
	return &SendError{Outcome: Reject, Err: fmt.Errorf(format, args...)}
}

func dead(format string, args ...any) error {
	return &SendError{Outcome: Dead, Err: fmt.Errorf(format, args...)}
}

func broken(format string, args ...any) error {
	return &SendError{Outcome: Broken, Err: fmt.Errorf(format, args...)}
}

func pause(after time.Duration, at time.Time, scope string, format string, args ...any) error {
	return &SendError{Outcome: Pause, RetryAfter: after, RetryAt: at, Scope: scope, Err: fmt.Errorf(format, args...)}
}

func retryAt(after time.Duration, at time.Time, format string, args ...any) error {
	return &SendError{Outcome: Retry, RetryAfter: after, RetryAt: at, Err: fmt.Errorf(format, args...)}
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

// post POSTs body to url with the header's name, value pairs and returns
// the status, header and up to 64 KiB of the answer's body, the rest
// drained so that the connection is reused. A request that cannot be made
// is Reject; one that got no answer is Unreached.
func post(ctx context.Context, c *http.Client, what, url string, body io.Reader, header ...string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return 0, nil, nil, reject("%s: %v", what, err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, Unreached(fmt.Errorf("%s: %w", what, err))
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, answer, nil
}

// snippet is the start of a body, for an error message.
func snippet(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 300 {
		b = b[:300]
	}
	return string(b)
}
