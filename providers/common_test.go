package providers

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// answer is what a fake service says to one request.
type answer struct {
	status  int
	headers map[string]string
	body    string
}

// fake is a loopback HTTP server of a vendor's API: check inspects each
// request (failing the test on a wrong shape) and returns the key that
// picks its answer from answers ("" or an unknown key: 200 with ok).
type fake struct {
	*httptest.Server
	mu       sync.Mutex
	requests int
}

func newFake(t *testing.T, ok answer, answers map[string]answer, check func(t *testing.T, r *http.Request) string) *fake {
	t.Helper()
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests++
		f.mu.Unlock()
		a, found := answers[check(t, r)]
		if !found {
			a = ok
		}
		for k, v := range a.headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(f.Close)
	return f
}

// want is the classification a case expects.
type want struct {
	outcome Outcome
	sent    bool
	id      string        // the provider's ID for a message sent
	scope   string        // for Pause
	after   time.Duration // RetryAfter, when set
	at      time.Time     // RetryAt, when set
	retry   bool          // a plain error (retried with backoff)
	text    string        // the error contains it
}

// checkOutcome compares what Send returned with w.
func checkOutcome(t *testing.T, name string, id string, err error, w want) {
	t.Helper()
	if w.sent {
		if err != nil || id != w.id {
			t.Errorf("%s: %q, %v; want sent as %q", name, id, err, w.id)
		}
		return
	}
	if id != "" {
		t.Errorf("%s: ID %q for a message not sent", name, id)
	}
	if err == nil {
		t.Errorf("%s: sent, want an error", name)
		return
	}
	if w.text != "" && !strings.Contains(err.Error(), w.text) {
		t.Errorf("%s: error %q does not contain %q", name, err, w.text)
	}
	var se *SendError
	if !errors.As(err, &se) {
		if !w.retry {
			t.Errorf("%s: plain error %v, want outcome %d", name, err, w.outcome)
		}
		return
	}
	if w.retry {
		t.Errorf("%s: %+v, want a plain error", name, se)
		return
	}
	if se.Outcome != w.outcome || se.Scope != w.scope || (w.after != 0 && se.RetryAfter != w.after) || !se.RetryAt.Equal(w.at) {
		t.Errorf("%s: got outcome %d scope %q after %s at %s, want %d %q %s %s", name,
			se.Outcome, se.Scope, se.RetryAfter, se.RetryAt, w.outcome, w.scope, w.after, w.at)
	}
}

// noRecipient fails the test if err's text shows recipient in clear: as
// given, in another case, without its + or escaped for a URL's path.
func noRecipient(t *testing.T, err error, recipient string) {
	t.Helper()
	if err == nil {
		return
	}
	text := strings.ToLower(err.Error())
	for _, form := range []string{recipient, strings.TrimPrefix(recipient, "+"), url.PathEscape(recipient)} {
		if strings.Contains(text, strings.ToLower(form)) {
			t.Errorf("%s: the error shows the recipient: %v", recipient, err)
			return
		}
	}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestUntrustedCertificateIsBroken: every HTTPS adapter, sending to a
// server whose certificate it does not trust, reaches nothing and says so
// as Broken (no retry helps: the provider is paused and the operator
// alerted); trusting the server's CA (Settings.RootCAs: ca_file) it sends.
func TestUntrustedCertificateIsBroken(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/3/device/"):
			w.Header().Set("apns-id", "A-1")
		case strings.HasSuffix(r.URL.Path, "/Messages.json"):
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"sid":"SM1"}`))
		case r.URL.Path == "/v3/mail/send":
			w.Header().Set("X-Message-Id", "SG1")
			w.WriteHeader(http.StatusAccepted)
		case strings.HasSuffix(r.URL.Path, "/messages:send"):
			_, _ = w.Write([]byte(`{"name":"projects/p/messages/1"}`))
		case r.URL.Path == "/v2/email/outbound-emails":
			_, _ = w.Write([]byte(`{"MessageId":"SES1"}`))
		default:
			t.Errorf("request %s", r.URL.Path)
		}
	}))
	srv.EnableHTTP2 = true                           // APNs speaks HTTP/2 only
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots, err := x509.SystemCertPool()
	if err != nil {
		t.Fatal(err)
	}
	roots.AddCert(srv.Certificate())
	p8, _ := apnsKey()
	email := []byte(`{"subject":"Welcome","body":"Hello"}`)
	for name, c := range map[string]struct {
		build func(Settings) Provider
		to    string
		data  []byte
		id    string
	}{
		"apns": {func(s Settings) Provider { p, _ := NewAPNs(s, "T", "K", "com.example.app", p8); return p },
			"dev-1", []byte(`{"title":"Hi","body":"Hello"}`), "A-1"},
		"twilio":   {func(s Settings) Provider { return NewTwilio(s, "AC1", "AC1", "token", "+15550001111", "") }, "+15550002222", []byte(`{"body":"Hello"}`), "SM1"},
		"sendgrid": {func(s Settings) Provider { return NewSendGrid(s, "SG.key", "noreply@example.com", "") }, "a@example.com", email, "SG1"},
		"fcm": {func(s Settings) Provider {
			p, _ := NewFCM(context.Background(), s, "p", "", "", "ya29.static")
			return p
		},
			"tok-1", []byte(`{"title":"Hi","body":"Hello"}`), "projects/p/messages/1"},
		"ses": {func(s Settings) Provider { return NewSES(s, "eu-west-1", "AKID", "secret", "noreply@example.com") }, "a@example.com", email, "SES1"},
	} {
		m := Message{ID: "t1", Recipient: c.to, Data: c.data}
		id, err := c.build(Settings{Name: name, BaseURL: srv.URL}).Send(ctx(t), m)
		checkOutcome(t, name+" untrusted", id, err, want{outcome: Broken, text: "certificate"})
		id, err = c.build(Settings{Name: name, BaseURL: srv.URL, RootCAs: roots}).Send(ctx(t), m)
		checkOutcome(t, name+" trusted", id, err, want{sent: true, id: c.id})
	}
}
