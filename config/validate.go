package config

import (
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/throttle"
)

// validName is what throttle accepts as a rule name; queues and campaigns
// follow it too, as their names end up in Redis keys and task IDs.
var validName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

const nameRule = "1-64 of A-Z a-z 0-9 _ . -"

// Validate checks every value of c and that every policy, provider and queue
// referenced is defined, and returns all the problems found as Load does.
// Load and Parse validate already; Validate is for a Config built in code.
func (c *Config) Validate() error {
	var errs errorList
	c.validate(&errs)
	return errs.err()
}

// validator checks a decoded Config. It skips settings whose decoding
// already failed, so a problem is reported once.
type validator struct {
	c    *Config
	errs *errorList
}

func (c *Config) validate(errs *errorList) {
	v := &validator{c: c, errs: errs}
	v.redis()
	v.worker()
	v.policies()
	v.providers()
	v.defaults()
	v.campaigns()
	c.rules(errs, v.clean)
}

// fail reports a problem with the setting at path; its line is that of the
// first of path and alts the file sets (see source.errorAt).
func (v *validator) fail(path string, alts []string, format string, args ...any) {
	if v.c.src.failedAt(path) {
		return
	}
	v.errs.add(v.c.src.errorAt(path, fmt.Sprintf(format, args...), alts...))
}

func (v *validator) failf(path, format string, args ...any) { v.fail(path, nil, format, args...) }

// clean reports whether no problem was found at path or inside it.
func (v *validator) clean(path string) bool {
	under := func(p string) bool {
		return p == path || strings.HasPrefix(p, path+".") || strings.HasPrefix(p, path+"[")
	}
	if v.c.src.failedAt(path) {
		return false
	}
	if v.c.src != nil {
		for p := range v.c.src.failed {
			if under(p) {
				return false
			}
		}
	}
	for _, e := range v.errs.errs {
		if under(e.Path) {
			return false
		}
	}
	return true
}

func (v *validator) positive(path string, n int) {
	if n <= 0 {
		v.failf(path, "must be > 0 (got %d)", n)
	}
}

func (v *validator) positiveDuration(path string, d time.Duration) {
	if d <= 0 {
		v.failf(path, "must be > 0 (got %s)", throttle.FormatDuration(d))
	}
}

func (v *validator) notNegative(path string, d time.Duration) {
	if d < 0 {
		v.failf(path, "must not be negative (got %s)", throttle.FormatDuration(d))
	}
}

func (v *validator) redis() {
	r := v.c.Redis
	switch {
	case r.Cluster != nil && r.URL != "":
		v.failf("redis.cluster", "cannot be used with redis.url: give one of them")
	case r.Cluster != nil && len(r.Cluster) == 0:
		v.failf("redis.cluster", "needs at least one node's host:port")
	case r.Cluster == nil:
		if msg := checkRedisURL(r.URL); msg != "" {
			v.failf("redis.url", "%s", msg)
		}
	}
	for i, a := range r.Cluster {
		if !validAddr(a) {
			v.failf(fmt.Sprintf("redis.cluster[%d]", i), "must be host:port (got %s)", quote(RedactURL(a)))
		}
	}
	v.redisLogin()
	if host, _, err := net.SplitHostPort(r.EmbeddedAddr); err != nil || !validAddr(r.EmbeddedAddr) || !isLoopback(host) {
		v.failf("redis.embedded_addr", "must be a loopback host:port such as %s, as the embedded server has no password (got %s)",
			DefaultEmbeddedAddr, quote(r.EmbeddedAddr))
	}
	switch {
	case r.Prefix == "":
		v.failf("redis.prefix", "must not be empty")
	case strings.ContainsAny(r.Prefix, "{}"):
		v.failf("redis.prefix", "must not contain '{' or '}' (got %s)", quote(r.Prefix))
	}
}

// validAddr reports whether a is host:port with a port from 1 to 65535.
func validAddr(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || strings.ContainsAny(host, " /") {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p >= 1 && p <= 65535
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

func (v *validator) worker() {
	w := v.c.Worker
	v.positive("worker.concurrency", w.Concurrency)
	if len(w.Queues) == 0 {
		v.failf("worker.queues", "needs at least one queue")
	}
	for _, name := range slices.Sorted(maps.Keys(w.Queues)) {
		path := join("worker.queues", name)
		if !validName.MatchString(name) {
			v.failf(path, "a queue name must be %s (got %s)", nameRule, quote(name))
		}
		v.positive(path, w.Queues[name])
	}
	v.positiveDuration("worker.shutdown_timeout", w.ShutdownTimeout)
	v.httpAddr()
	v.notNegative("worker.inline_wait", w.InlineWait)
	v.notNegative("worker.jitter", w.Jitter)
	v.notNegative("worker.sent_marks", w.SentMarks)
	if w.RememberTakes < throttle.MinRemember {
		v.failf("worker.remember_takes", "must be at least %s (got %s)",
			throttle.FormatDuration(throttle.MinRemember), throttle.FormatDuration(w.RememberTakes))
	}
}

func (v *validator) policies() {
	for _, name := range slices.Sorted(maps.Keys(v.c.Policies)) {
		path := join("policies", name)
		pol := v.c.Policies[name]
		if len(pol) == 0 {
			v.failf(path, "needs at least one window, e.g. [{limit: 1, per: 24h}]")
		}
		for i, w := range pol {
			p := fmt.Sprintf("%s[%d]", path, i)
			v.positive(p+".limit", w.Limit)
			if w.Per > 0 && w.Per < time.Millisecond {
				v.failf(p+".per", "must be at least 1ms (got %s)", throttle.FormatDuration(w.Per))
			}
			v.positiveDuration(p+".per", w.Per)
		}
	}
}

func (v *validator) providers() {
	for _, name := range slices.Sorted(maps.Keys(v.c.Providers)) {
		path := join("providers", name)
		pr := v.c.Providers[name]
		switch {
		case math.IsInf(pr.Rate, 0) || math.IsNaN(pr.Rate):
			v.failf(path+".rate", "must be a finite number (got %v)", pr.Rate)
		case pr.Rate <= 0:
			v.failf(path+".rate", "must be > 0 (got %s)", strconv.FormatFloat(pr.Rate, 'g', -1, 64))
		}
		v.positive(path+".burst", pr.Burst)
		only := func(key, typ string) { v.failf(path+"."+key, "only for a %s provider", typ) }
		switch pr.Type {
		case ProviderLog:
			if pr.Output == "" {
				v.failf(path+".output", "must not be empty: stdout, stderr or a file path")
			}
			if pr.URL != "" {
				only("url", ProviderWebhook)
			}
			if pr.Timeout != 0 {
				only("timeout", ProviderWebhook)
			}
			if pr.Headers != nil {
				only("headers", ProviderWebhook)
			}
		case ProviderWebhook:
			if pr.Output != "" {
				only("output", ProviderLog)
			}
			v.webhookURL(path+".url", string(pr.URL))
			v.positiveDuration(path+".timeout", pr.Timeout)
			for _, h := range slices.Sorted(maps.Keys(pr.Headers)) {
				if !isToken(h) {
					v.failf(join(path+".headers", h), "not a valid header name (got %s)", quote(h))
				}
				if strings.ContainsAny(string(pr.Headers[h]), "\r\n\x00") {
					v.failf(join(path+".headers", h), "must not contain a line break or NUL")
				}
			}
		default:
			v.failf(path+".type", "must be %s or %s (got %s)", ProviderLog, ProviderWebhook, quote(pr.Type))
		}
	}
}

func (v *validator) webhookURL(path, u string) {
	if u == "" {
		v.failf(path, "required for a webhook provider")
		return
	}
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		v.failf(path, "must be an http:// or https:// URL (got %s)", v.c.src.shown(path, u))
	}
}

// isToken reports whether s is an HTTP header name (RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 0x7E || r <= 0x20 || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

func (v *validator) defaults() {
	df := v.c.Defaults
	if df.Policy != "" {
		v.ref("defaults.policy", "policy", df.Policy, "policies", slices.Collect(maps.Keys(v.c.Policies)))
	}
	if df.Provider != "" {
		v.ref("defaults.provider", "provider", df.Provider, "providers", slices.Collect(maps.Keys(v.c.Providers)))
	}
	v.ref("defaults.queue", "queue", df.Queue, "worker.queues", slices.Collect(maps.Keys(v.c.Worker.Queues)))
}

// ref checks that name is one of defined, the keys of the setting at
// definedPath. Its line is that of path or, when the file leaves path to its
// default, of definedPath, which then lacks the default.
func (v *validator) ref(path, kind, name, definedPath string, defined []string) {
	if slices.Contains(defined, name) || v.c.src.failedAt(definedPath) {
		return
	}
	list := "none defined"
	if len(defined) > 0 {
		slices.Sort(defined)
		if len(defined) > 10 {
			defined = append(defined[:10], "...")
		}
		list = "defined: " + strings.Join(defined, ", ")
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
		if cp.Cron == "" {
			v.failf(path+".cron", "must not be empty")
		}
		if cp.Template == "" {
			v.failf(path+".template", "must not be empty")
		}
		v.checkCampaign(path, cp)
		v.campaignRef(path+".policy", "policy", cp.Policy, v.c.Defaults.Policy, "policies", slices.Collect(maps.Keys(v.c.Policies)))
		v.campaignRef(path+".provider", "provider", cp.Provider, v.c.Defaults.Provider, "providers", slices.Collect(maps.Keys(v.c.Providers)))
		if cp.Queue != "" {
			v.ref(path+".queue", "queue", cp.Queue, "worker.queues", slices.Collect(maps.Keys(v.c.Worker.Queues)))
		}
		v.notNegative(path+".send_by_window", cp.SendByWindow)
	}
}

// campaignRef checks a campaign's policy or provider; when it names none, the
// default applies, and defaults() checks that one.
func (v *validator) campaignRef(path, kind, name, def, definedPath string, defined []string) {
	switch {
	case name != "":
		v.ref(path, kind, name, definedPath, defined)
	case def == "":
		v.failf(path, "required, as defaults.%s is not set", kind)
	}
}
