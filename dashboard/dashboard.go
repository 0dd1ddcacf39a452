// Package dashboard serves what an operator of the worker looks at: the
// throttle view at /throttle, its data as JSON under /throttle/api/, and
// asynq's dashboard (asynqmon) at /monitoring/, behind one access check.
// What each shows and how it reads Redis: docs/design.md#the-dashboard.
package dashboard

import (
	"context"
	"crypto/subtle"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

// Options configure a dashboard.
type Options struct {
	Redis redis.UniversalClient // the worker's client
	// Config gives the campaigns, the key prefix and the dashboard's
	// settings, which a reload does not change, and the policies and
	// providers unless Current is set.
	Config *config.Config
	// Current returns the config in effect at every request, so that the
	// views show a reload's policies and providers at once.
	Current func() *config.Config
	// Secret is the password (basic) or token (bearer) dashboard.auth
	// asks for.
	Secret       string
	Campaigns    Campaigns           // nil shows no last fan-outs
	Metrics      prometheus.Gatherer // the worker's registry, for its deferrals; nil shows none
	Suppressions Suppressions        // nil shows no suppressions
}

// Suppressions tells whether recipient is suppressed now, why, and until
// when: shown first among the rules that hold the recipient's messages.
type Suppressions interface {
	Suppressed(ctx context.Context, recipient string) (Suppression, bool, error)
}

// Suppression is one recipient's suppression.
type Suppression struct {
	Reason string    // "unsubscribed", "hard bounce"
	Until  time.Time // zero: until it is lifted
}

// Campaigns reports each campaign's last fan-out (campaign.Runner does).
type Campaigns interface {
	Latest(ctx context.Context) ([]campaign.Summary, error)
}

// Dashboard is the http.Handler of /throttle, /throttle/api/ and
// /monitoring/.
type Dashboard struct {
	opts Options
	lim  *throttle.Limiter // asks the rules what holds a recipient: Check writes nothing
	mux  *http.ServeMux
	live atomic.Pointer[live]
}

// live is what the views read of the config in effect, made again when a
// reload replaces it.
type live struct {
	cfg                 *config.Config
	rdb                 redis.UniversalClient
	policies, providers []string // sorted
	quotas              map[string]*throttle.Quota
	buckets             map[string]*throttle.Bucket
}

// New returns the dashboard of opts.
func New(opts Options) *Dashboard {
	cfg := opts.Config
	d := &Dashboard{opts: opts, mux: http.NewServeMux()}
	// A loaded config's prefix is valid, and Check only reads the takes.
	d.lim, _ = throttle.New(opts.Redis, throttle.Options{Prefix: cfg.Redis.Prefix, Remember: cfg.Worker.RememberTakes})
	d.mux.HandleFunc("GET /throttle", d.page)
	d.mux.HandleFunc("GET /throttle/{$}", d.page)
	index := serveJSON(func(context.Context, *http.Request, int, int) (any, error) {
		return map[string]any{"endpoints": endpoints}, nil
	})
	d.mux.Handle("GET /throttle/api/{$}", index)
	d.mux.Handle("GET /throttle/api", index)
	d.mux.Handle("GET /throttle/api/providers", serveJSON(d.providers))
	d.mux.Handle("GET /throttle/api/policies", serveJSON(d.policies))
	d.mux.Handle("GET /throttle/api/recipients/{id}", serveJSON(func(ctx context.Context, r *http.Request, _, _ int) (recipientView, error) {
		return d.lookupRecipient(ctx, r, r.PathValue("id"))
	}))
	d.mux.Handle("GET /throttle/api/campaigns", serveJSON(d.campaigns))
	d.mux.Handle("/monitoring/", monitoring(opts.Redis, cfg.Worker.Dashboard.Actions))
	d.mux.Handle("GET /monitoring", http.RedirectHandler("/monitoring/", http.StatusMovedPermanently))
	return d
}

func (d *Dashboard) current() *live {
	cfg := d.opts.Config
	if d.opts.Current != nil {
		if c := d.opts.Current(); c != nil {
			cfg = c
		}
	}
	if l := d.live.Load(); l != nil && l.cfg == cfg {
		return l
	}
	l := newLive(d.opts.Redis, cfg)
	d.live.Store(l)
	return l
}

func newLive(rdb redis.UniversalClient, cfg *config.Config) *live {
	l := &live{cfg: cfg, rdb: rdb, policies: slices.Sorted(maps.Keys(cfg.Policies)), providers: slices.Sorted(maps.Keys(cfg.Providers))}
	l.quotas, l.buckets, _ = cfg.Rules() // a loaded config's rules build
	return l
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

// allowed reports whether r carries the credentials the config asks for,
// compared in constant time.
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
