//go:build integration

package security_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/dashboard"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/throttle"
)

// TestThrottleViewWithRecommendedACL: the throttle view and its JSON read
// only what the least-privilege user config.yaml recommends may read. (The
// asynq dashboard at /monitoring/ reads more, INFO for one; it is not held
// to this.)
func TestThrottleViewWithRecommendedACL(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{Users: []string{recommendedACL(t)}})
	app := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: aclUser, Password: aclPassword})
	t.Cleanup(func() { _ = app.Close() })
	cfg, err := config.Parse("acl.yaml", []byte(`
policies: {marketing: [{limit: 1, per: 24h}, {limit: 3, per: 168h}]}
providers: {sms: {type: log, rate: 1, burst: 1}}
defaults: {policy: marketing, provider: sms}
campaigns:
  - {name: digest, cron: "@daily", audience: {redis_set: "throttle:digest"}, template: digest}
`))
	if err != nil {
		t.Fatal(err)
	}
	quotas, buckets, err := cfg.Rules()
	if err != nil {
		t.Fatal(err)
	}
	lim, err := throttle.New(app, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 3; i++ { // one sent, two booked: entries, tickets and a tail
		_, err := lim.Book(ctx, throttle.Request{ID: fmt.Sprintf("t%d", i), Takes: []throttle.Take{
			{Rule: quotas["marketing"], Subject: fmt.Sprintf("r%d@example.com", i%2)}, {Rule: buckets["sms"], Subject: "sms"}}}, throttle.Booking{})
		if err != nil {
			t.Fatal(err)
		}
	}
	runner, err := campaign.New(cfg, app, campaign.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(dashboard.New(dashboard.Options{Redis: app, Config: cfg, Campaigns: runner}))
	t.Cleanup(web.Close)
	for _, p := range []string{"/throttle?recipient=r0@example.com", "/throttle/api/providers", "/throttle/api/policies",
		"/throttle/api/campaigns", "/throttle/api/recipients/r0@example.com"} {
		resp, err := http.Get(web.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "NOPERM") {
			t.Errorf("GET %s as the ACL user: %d %.300s", p, resp.StatusCode, body)
		}
	}
}
