package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/throttle"
)

// validName is throttle's rule name, for queues and campaigns too, as their
// names end up in Redis keys and task IDs.
var validName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

const nameRule = "1-64 of A-Z a-z 0-9 _ . -"

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate checks every value of a Config built in code, and that what it
// references is defined, reporting as Load does (which validates already).
func (c *Config) Validate() error {
	var errs errorList
	c.validate(&errs)
	return errs.err()
}

// validator checks a decoded Config, skipping settings whose decoding failed.
type validator struct {
	c    *Config
	errs *errorList
}

func (c *Config) validate(errs *errorList) {
	v := &validator{c: c, errs: errs}
	c.Redis.Check(c.src.errorAt("redis.url", "").Path, v.failf) // redis.url, or the variable that replaced it
	v.worker()
	v.policies()
	v.providers()
	v.defaults()
	v.campaigns()
	v.tenants()
	v.api()
	v.events()
	c.rules(errs, v.clean)
}

// fail reports a problem at path, on a line as source.errorAt chooses.
func (v *validator) fail(path string, alts []string, format string, args ...any) {
	if !v.c.src.failedAt(path) {
		*v.errs = append(*v.errs, v.c.src.errorAt(path, fmt.Sprintf(format, args...), alts...))
	}
}

func (v *validator) failf(path, format string, args ...any) { v.fail(path, nil, format, args...) }

func (v *validator) check(ok bool, path, format string, args ...any) {
	if !ok {
		v.failf(path, format, args...)
	}
}

// clean reports whether no problem was found at path or inside it.
func (v *validator) clean(path string) bool {
	return !slices.ContainsFunc(*v.errs, func(e *Error) bool {
		rest, ok := strings.CutPrefix(e.Path, path)
		return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
	})
}

// given reports whether the file sets the secret s at path: to a value, to
// a reference a producer left unresolved (its value then empty), or to one
// that failed to resolve. Ask this, never s != "", so that a producer and a
// worker agree on what a file sets.
func (v *validator) given(path string, s Secret) bool {
	return s != "" || v.c.src.isUnresolved(path) || v.c.src.failedAt(path)
}

func (v *validator) positive(path string, n int) { v.check(n > 0, path, "must be > 0 (got %d)", n) }

// durationAtLeast checks d >= least, saying "> 0" for 1ns, "not negative" for 0.
func (v *validator) durationAtLeast(path string, d, least time.Duration) {
	switch {
	case d >= least:
	case least == 0:
		v.failf(path, "must not be negative (got %s)", timefmt.Duration(d))
	case least == time.Nanosecond:
		v.failf(path, "must be > 0 (got %s)", timefmt.Duration(d))
	default:
		v.failf(path, "must be at least %s (got %s)", timefmt.Duration(least), timefmt.Duration(d))
	}
}

func (v *validator) worker() {
	w := v.c.Worker
	v.positive("worker.concurrency", w.Concurrency)
	v.check(len(w.Queues) > 0, "worker.queues", "needs at least one queue")
	for _, name := range slices.Sorted(maps.Keys(w.Queues)) {
		v.check(validName.MatchString(name), join("worker.queues", name), "a queue name must be %s (got %s)", nameRule, quote(name))
		v.positive(join("worker.queues", name), w.Queues[name])
	}
	v.durationAtLeast("worker.shutdown_timeout", w.ShutdownTimeout, time.Nanosecond)
	v.durationAtLeast("worker.poll_interval", w.PollInterval, time.Millisecond)
	v.httpAddr()
	v.durationAtLeast("worker.inline_wait", w.InlineWait, 0)
	v.durationAtLeast("worker.book_ahead", w.BookAhead, 0)
	for i, q := range w.PriorityQueues {
		_, ok := w.Queues[q]
		v.check(ok, fmt.Sprintf("worker.priority_queues[%d]", i), "%s is not one of worker.queues", quote(q))
	}
	v.durationAtLeast("worker.jitter", w.Jitter, 0)
	v.durationAtLeast("worker.sent_marks", w.SentMarks, 0)
	v.durationAtLeast("worker.remember_takes", w.RememberTakes, throttle.MinRemember)
	v.check(w.WindowMargin >= 0 && w.WindowMargin <= time.Minute, "worker.window_margin",
		"must be from 0 to 1m (got %s)", timefmt.Duration(w.WindowMargin))
	v.check(w.DeadAfter == 0 || w.DeadAfter >= time.Second, "worker.dead_after",
		"must be 0 (off) or at least 1s (got %s)", timefmt.Duration(w.DeadAfter))
}

// httpAddr checks worker.http_addr, under the name the file gave it, and
// that a dashboard off loopback has auth or says it needs none.
func (v *validator) httpAddr() {
	w, key, what := v.c.Worker, "worker.http_addr", "the HTTP server"
	if v.c.src.has("worker.metrics_addr") && !v.c.src.has(key) {
		key, what = "worker.metrics_addr", "metrics"
	}
	if !v.addr(key, w.HTTPAddr, what) {
		return
	}
	db := w.Dashboard
	if db.Auth != "" && db.Auth != DashboardBasic && db.Auth != DashboardBearer {
		v.failf("worker.dashboard.auth", `must be %s or %s, or "" for none (got %s)`, DashboardBasic, DashboardBearer, quote(db.Auth))
		return
	}
	basic := db.Auth == DashboardBasic
	v.check(!basic || db.Username != "", "worker.dashboard.username", "required for basic auth")
	v.check(basic || db.Username == "", "worker.dashboard.username", "only for basic auth")
	v.check(envName.MatchString(db.SecretEnv), "worker.dashboard.secret_env",
		"must be an environment variable's name (got %s)", quote(db.SecretEnv))
	if !db.InsecureNoAuth && w.openDashboard() {
		v.fail(key, []string{"worker.dashboard"}, "%s is not a loopback address, and the dashboard there would have no auth: "+
			"set worker.dashboard.auth (basic or bearer), or worker.dashboard.enabled: false, "+
			"or worker.dashboard.insecure_no_auth: true to serve it to anyone who reaches it", quote(w.HTTPAddr))
	}
}

func (v *validator) policies() {
	for _, name := range slices.Sorted(maps.Keys(v.c.Policies)) {
		path := join("policies", name)
		pol, wpath := v.c.Policies[name], path
		for f := range reflect.TypeFor[Policy]().Fields() { // the long form, {windows: [...], ...}
			if key, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); v.c.src.has(path + "." + key) {
				wpath = path + ".windows"
			}
		}
		v.check(len(pol.Windows)+len(pol.Calendar) > 0, wpath, "needs at least one window, e.g. [{limit: 1, per: 24h}]")
		v.local(path, pol)
		v.durationAtLeast(path+".max_delay", pol.MaxDelay, 0)
		v.check(pol.MaxDelay == 0 || pol.OverCap == OverCapDefer, path+".max_delay",
			"only with over_cap: %s (got over_cap: %s)", OverCapDefer, pol.OverCap)
		for i, other := range pol.CountsToward {
			switch p := fmt.Sprintf("%s.counts_toward[%d]", path, i); {
			case other == name:
				v.failf(p, "a policy cannot count toward itself (got %s)", quote(other))
			case slices.Contains(pol.CountsToward[:i], other):
				v.failf(p, "%s is given twice", quote(other))
			default:
				v.ref(p, "policy", other)
			}
		}
		for i, w := range pol.Windows {
			p := fmt.Sprintf("%s[%d]", wpath, i)
			v.positive(p+".limit", w.Limit)
			v.check(w.Per <= 0 || w.Per >= time.Millisecond, p+".per", "must be at least 1ms (got %s)", timefmt.Duration(w.Per))
			v.durationAtLeast(p+".per", w.Per, time.Nanosecond)
		}
	}
}

// local checks a policy's calendar windows, quiet hours and zone.
func (v *validator) local(path string, pol Policy) {
	seen := map[string]int{}
	for i, c := range pol.Calendar {
		p := fmt.Sprintf("%s.calendar[%d]", path, i)
		v.positive(p+".limit", c.Limit)
		v.check(c.WeekStart == "" || c.Per == "week", p+".week_start", "only with per: week (got per: %s)", c.Per)
		j, dup := seen[calendarName("", c)]
		v.check(!dup, p, "the same calendar window as calendar[%d]: give one limit per window", j)
		seen[calendarName("", c)] = i
	}
	for i, q := range pol.Quiet {
		_, err := throttle.ParseQuietRange(q)
		v.check(err == nil, fmt.Sprintf("%s.quiet[%d]", path, i), "%v", err)
	}
	v.zone(path+".timezone", pol.TimeZone)
}

// zone checks an IANA time zone's name; "" is UTC.
func (v *validator) zone(path, name string) {
	_, err := timefmt.LoadZone(name)
	v.check(err == nil || name == "", path, "%v", err)
}

func (v *validator) providers() {
	for _, name := range slices.Sorted(maps.Keys(v.c.Providers)) {
		path, pr := join("providers", name), v.c.Providers[name]
		finite := !math.IsInf(pr.Rate, 0) && !math.IsNaN(pr.Rate)
		v.check(finite, path+".rate", "must be a finite number (got %v)", pr.Rate)
		v.check(!finite || pr.Rate > 0, path+".rate", "must be > 0 (got %v)", pr.Rate)
		v.positive(path+".burst", pr.Burst)
		v.check(pr.Burst <= 0 || pr.PriorityReserve >= 0 && pr.PriorityReserve < pr.Burst, path+".priority_reserve",
			"must be from 0 to burst - 1 (%d) (got %d)", pr.Burst-1, pr.PriorityReserve)
		only := func(set bool, key, typ string) { v.check(!set, path+"."+key, "only for a %s provider", typ) }
		v.serviceKeysOnly(path, pr)
		switch pr.Type {
		case ProviderLog:
			v.check(pr.Output != "", path+".output", "must not be empty: stdout, stderr or a file path")
			only(v.given(path+".url", pr.URL), "url", ProviderWebhook)
			only(pr.Timeout != 0, "timeout", ProviderWebhook)
			only(pr.CAFile != "", "ca_file", "webhook or service")
			only(pr.Headers != nil, "headers", ProviderWebhook)
		case ProviderWebhook:
			only(pr.Output != "", "output", ProviderLog)
			if v.c.src.isUnresolved(path + ".url") {
				// a producer's: checked where it is resolved, on the workers
			} else if pr.URL == "" {
				v.failf(path+".url", "required for a webhook provider")
			} else if !isHTTPURL(string(pr.URL)) {
				v.failf(path+".url", "must be an http:// or https:// URL (got %s)", v.c.src.shown(path+".url", string(pr.URL)))
			}
			v.durationAtLeast(path+".timeout", pr.Timeout, time.Nanosecond)
			v.caFile(path+".ca_file", pr.CAFile)
			for _, h := range slices.Sorted(maps.Keys(pr.Headers)) {
				v.check(isToken(h), join(path+".headers", h), "not a valid header name (got %s)", quote(h))
				v.check(!strings.ContainsAny(string(pr.Headers[h]), "\r\n\x00"), join(path+".headers", h), "must not contain a line break or NUL")
			}
		case ProviderSMTP, ProviderSES, ProviderTwilio, ProviderFCM, ProviderAPNs, ProviderSendGrid:
			only(pr.Output != "", "output", ProviderLog)
			only(v.given(path+".url", pr.URL), "url", ProviderWebhook)
			only(pr.Headers != nil, "headers", ProviderWebhook)
			v.caFile(path+".ca_file", pr.CAFile)
			v.service(path, pr)
		default:
			v.failf(path+".type", "must be one of log, webhook, smtp, ses, twilio, fcm, apns, sendgrid (got %s)", quote(pr.Type))
		}
	}
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// isToken reports whether s is an HTTP header name (RFC 9110 token).
func isToken(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return r > 0x7E || r <= 0x20 || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	})
}

func (v *validator) defaults() {
	df := v.c.Defaults
	if df.Policy != "" {
		v.ref("defaults.policy", "policy", df.Policy)
	}
	if df.Provider != "" {
		v.ref("defaults.provider", "provider", df.Provider)
	}
	v.ref("defaults.queue", "queue", df.Queue)
}

// ref checks that the config defines name, a policy, provider or queue
// (kind). If path is a default the file leaves out, the line is that of the
// setting that lacks name.
func (v *validator) ref(path, kind, name string) {
	definedPath, defined := "worker.queues", slices.Collect(maps.Keys(v.c.Worker.Queues))
	switch kind {
	case "policy":
		definedPath, defined = "policies", slices.Collect(maps.Keys(v.c.Policies))
	case "provider":
		definedPath, defined = "providers", slices.Collect(maps.Keys(v.c.Providers))
	}
	if slices.Contains(defined, name) || v.c.src.failedAt(definedPath) {
		return
	}
	list := "none defined"
	if len(defined) > 0 {
		list = "defined: " + Listed(defined)
	}
	v.fail(path, []string{definedPath}, "%s %s is not defined (%s)", kind, quote(name), list)
}

func (v *validator) campaigns() {
	first := map[string]string{}
	for i, cp := range v.c.Campaigns {
		path := fmt.Sprintf("campaigns[%d]", i)
		switch {
		case cp.Name == "":
			v.failf(path+".name", "must not be empty")
		case !validName.MatchString(cp.Name):
			v.failf(path+".name", "must be %s (got %s)", nameRule, quote(cp.Name))
		case first[cp.Name] != "":
			v.failf(path+".name", "campaign %s is already defined by %s", quote(cp.Name), first[cp.Name])
		default:
			first[cp.Name] = path
		}
		v.check(cp.Cron != "", path+".cron", "must not be empty")
		v.check(cp.Template != "", path+".template", "must not be empty")
		if _, err := cp.Location(); err != nil {
			v.failf(path+".timezone", "%s (got %s)", err, quote(cp.Timezone))
		} else if _, err := cp.Schedule(); err != nil && cp.Cron != "" {
			v.failf(path+".cron", "not a cron schedule: %s (got %s)", err, quote(cp.Cron))
		}
		v.audience(path+".audience", cp.Audience)
		v.durationAtLeast(path+".catch_up", cp.CatchUp, 0)
		v.campaignRef(path+".policy", "policy", cp.Policy, v.c.Defaults.Policy)
		v.campaignRef(path+".provider", "provider", cp.Provider, v.c.Defaults.Provider)
		if cp.Queue != "" {
			v.ref(path+".queue", "queue", cp.Queue)
		}
		v.durationAtLeast(path+".send_by_window", cp.SendByWindow, 0)
		v.zone(path+".recipient_tz", cp.RecipientTZ)
		v.tenant(path+".tenant", cp.Tenant)
	}
}

// tenant checks a campaign's tenant as a notification's is checked.
func (v *validator) tenant(path, tenant string) {
	if len(tenant) > throttle.MaxIDLen {
		v.failf(path, "at most %d bytes (got %d)", throttle.MaxIDLen, len(tenant))
	} else if strings.IndexFunc(tenant, unicode.IsControl) >= 0 {
		v.failf(path, "must not contain control characters (got %s)", quote(tenant))
	}
}

// campaignRef checks a campaign's policy or provider, or that a default applies.
func (v *validator) campaignRef(path, kind, name, def string) {
	if name != "" {
		v.ref(path, kind, name)
	} else if def == "" {
		v.failf(path, "required, as defaults.%s is not set", kind)
	}
}

// audience checks that a campaign's audience is a file it can read or a set.
func (v *validator) audience(path string, a Audience) {
	switch {
	case a.File == "" && a.RedisSet == "":
		v.failf(path, "needs file (one recipient per line) or redis_set (a Redis set's key)")
	case a.File != "" && a.RedisSet != "":
		v.failf(path, "give one of file and redis_set")
	case a.File != "":
		err := readable(a.File)
		v.check(err == nil, path+".file", "cannot read: %s", err)
	}
}

// readable reports why the file at path cannot be read, or nil.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	if _, err = f.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (v *validator) tenants() {
	for _, name := range slices.Sorted(maps.Keys(v.c.Tenants.Weights)) {
		path, w := join("tenants.weights", name), v.c.Tenants.Weights[name]
		v.check(name != "", path, "a tenant name must not be empty")
		v.check(len(name) <= throttle.MaxIDLen, path, "a tenant name is at most %d bytes (got %d)", throttle.MaxIDLen, len(name))
		v.check(w >= 1 && w <= throttle.MaxWeight, path, "must be from 1 to %d (got %d)", throttle.MaxWeight, w)
	}
}
