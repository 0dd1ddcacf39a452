package api

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/notify-throttle/throttler/throttle"
)

// TestKeysAndRecipientsStayOut: the access log, the metrics and Redis
// never hold an API key, right or wrong, and the log names no recipient
// unless api.log_recipients says to.
func TestKeysAndRecipientsStayOut(t *testing.T) {
	for _, logRecipients := range []bool{false, true} {
		rdb, _ := shared.NewClient(t)
		cfg := testConfig()
		cfg.API.LogRecipients = logRecipients
		lim, err := throttle.New(rdb, throttle.Options{Prefix: cfg.Redis.Prefix})
		if err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		reg := prometheus.NewRegistry()
		s, err := New(Options{Config: cfg, Redis: rdb, Limiter: lim, Metrics: reg, Log: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		wrong := "billing-0123456789abcdeW"
		for _, key := range []string{billingKey, wrong} {
			for _, body := range []string{welcome, `{"recipient":"alice@example.com"}`} {
				req := httptest.NewRequest(http.MethodPost, "/v1/notifications", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				s.ServeHTTP(httptest.NewRecorder(), req)
			}
		}
		metrics := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(metrics, httptest.NewRequest("GET", "/metrics", nil))
		var stored strings.Builder
		ctx := context.Background()
		for _, k := range rdb.Keys(ctx, "*").Val() {
			stored.WriteString(k + "\n")
			if v, err := rdb.Dump(ctx, k).Result(); err == nil {
				stored.WriteString(v + "\n")
			}
		}
		for what, text := range map[string]string{"the log": log.String(), "the metrics": metrics.Body.String(), "Redis": stored.String()} {
			for _, key := range []string{billingKey, wrong} {
				if strings.Contains(text, key) {
					t.Errorf("%s holds the API key %s:\n%s", what, key, text)
				}
			}
		}
		if got := strings.Contains(log.String(), "alice@example.com"); got != logRecipients || !strings.Contains(log.String(), "key=billing") {
			t.Errorf("log_recipients %t: the log names the recipient: %t, want %t; and the key by its name:\n%s", logRecipients, got, logRecipients, log.String())
		}
	}
}
