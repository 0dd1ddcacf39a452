// Package dashboard serves what an operator of the worker looks at: the
// throttle view at /throttle (providers, policies, a recipient's windows,
// campaigns), the same data as JSON under /throttle/api/, and asynq's own
// dashboard (asynqmon) at /monitoring/. Both sit behind one access check
// (basic auth, a bearer token, or none on a loopback address).
//
// Every page and API call reads a bounded number of Redis commands, however
// many recipients and keys exist (see package inspect), and every list is
// paginated with offset and limit.
package dashboard

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/inspect"
)

// Options configure a dashboard.
type Options struct {
	// Redis is the worker's client: asynq's queues and the throttle state.
	Redis redis.UniversalClient
	// Config gives the policies, providers, campaigns, key prefix and the
	// dashboard's settings (worker.dashboard).
	Config *config.Config
	// Current, if set, returns the config in effect, read at every request:
	// a reload (SIGHUP) replaces the policies and providers, and the views
	// show the new ones at once. Nil: Config, always. Config still gives
	// the campaigns, the key prefix and the dashboard's own settings, which
	// a reload does not change.
	Current func() *config.Config
	// Secret is the password (basic auth) or token (bearer) the config's
	// dashboard.auth asks for; "" when it asks for none.
	Secret string
	// Campaigns reports the campaigns' last fan-outs; nil shows none.
	Campaigns Campaigns
	// Metrics is the worker's registry, for its deferral counts; nil
	// shows none.
	Metrics prometheus.Gatherer
}

// Campaigns reports each campaign's last fan-out (campaign.Runner does).
type Campaigns interface {
	Latest(ctx context.Context) ([]campaign.Summary, error)
}

// Dashboard is the http.Handler of /throttle, /throttle/api/ and
// /monitoring/.
type Dashboard struct {
	opts Options
	in   *inspect.Inspector
	mux  *http.ServeMux
}

// New returns the dashboard of opts.
func New(opts Options) *Dashboard {
	cfg := opts.Config
	var pols []inspect.Policy
	for name, p := range cfg.Policies {
		ip := inspect.Policy{Name: name}
		for _, w := range p.Windows {
			ip.Windows = append(ip.Windows, inspect.Window{Limit: w.Limit, Per: w.Per})
		}
		pols = append(pols, ip)
	}
	var provs []inspect.Provider
	for name, p := range cfg.Providers {
		provs = append(provs, inspect.Provider{Name: name, Rate: p.Rate, Burst: p.Burst})
	}
	d := &Dashboard{opts: opts, in: inspect.New(opts.Redis, cfg.Redis.Prefix, pols, provs), mux: http.NewServeMux()}
	d.mux.HandleFunc("GET /throttle", d.page)
	d.mux.HandleFunc("GET /throttle/{$}", d.page)
	d.mux.HandleFunc("GET /throttle/api/providers", d.apiProviders)
	d.mux.HandleFunc("GET /throttle/api/policies", d.apiPolicies)
	d.mux.HandleFunc("GET /throttle/api/recipients/{id}", d.apiRecipient)
	d.mux.HandleFunc("GET /throttle/api/campaigns", d.apiCampaigns)
	d.mux.Handle("/monitoring/", monitoring(opts.Redis, cfg.Worker.Dashboard.Actions))
	d.mux.Handle("GET /monitoring", http.RedirectHandler("/monitoring/", http.StatusMovedPermanently))
	return d
}

// ServeHTTP checks access, then serves the request.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !d.allowed(r) {
		if d.opts.Config.Worker.Dashboard.Auth == config.DashboardBasic {
			w.Header().Set("WWW-Authenticate", `Basic realm="throttler", charset="UTF-8"`)
		} else {
			w.Header().Set("WWW-Authenticate", `Bearer realm="throttler"`)
		}
		http.Error(w, "unauthorized: the dashboard needs "+d.opts.Config.Worker.Dashboard.Auth+" auth", http.StatusUnauthorized)
		return
	}
	d.mux.ServeHTTP(w, r)
}

// allowed reports whether r carries the credentials the config asks for.
// Both sides are compared in constant time.
func (d *Dashboard) allowed(r *http.Request) bool {
	db := d.opts.Config.Worker.Dashboard
	same := func(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
	switch db.Auth {
	case config.DashboardBasic:
		user, pass, ok := r.BasicAuth()
		return ok && same(user, db.Username) && same(pass, d.opts.Secret)
	case config.DashboardBearer:
		h := r.Header.Get("Authorization")
		scheme, token, ok := strings.Cut(h, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && same(strings.TrimSpace(token), d.opts.Secret)
	}
	return true
}

// Paths are where the dashboard serves, for the worker to mount it.
var Paths = []string{"/throttle", "/throttle/", "/monitoring", "/monitoring/"}

// requestTimeout bounds the Redis reads of one request.
const requestTimeout = 10 * time.Second
