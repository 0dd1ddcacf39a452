package config

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode"

	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/throttle"
)

// Defaults of an API key's rate limit (package api), in notifications.
const (
	DefaultAPIRate  = 100 // per second
	DefaultAPIBurst = 100 // at once: a full batch
	// MinAPIKeyLen is the shortest key accepted: a generated token
	// (openssl rand -hex 32 gives 64 characters), not a password.
	MinAPIKeyLen = 16
)

// API is the HTTP API's settings (package api): the address it listens
// on and the keys that may use it.
type API struct {
	Addr          string            `yaml:"addr"`           // host:port; "": no API (default)
	LogRecipients bool              `yaml:"log_recipients"` // recipients in the access log; default false
	Keys          map[string]APIKey `yaml:"keys"`           // by name; at least one with Addr
}

// APIKey is one client of the API: its secret key, the tenant its
// notifications are sent as, and what it may use.
type APIKey struct {
	Key       Secret   `yaml:"key,required,secret=API key"`
	Tenant    string   `yaml:"tenant,required"` // its notifications' fair-share tenant; "" the default tenant
	Policies  []string `yaml:"policies"`        // the policies it may use; default any
	Providers []string `yaml:"providers"`       // the providers it may use; default any
	Rate      float64  `yaml:"rate"`            // notifications per second; default DefaultAPIRate
	Burst     int      `yaml:"burst"`           // default DefaultAPIBurst
}

// Fill gives an API key read from a file its rate limit's defaults.
func (k *APIKey) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("rate") {
		k.Rate = DefaultAPIRate
	}
	if !has("burst") {
		k.Burst = DefaultAPIBurst
	}
}

// Allows reports whether the key may use a policy and a provider.
func (k APIKey) Allows(policy, provider string) (policyOK, providerOK bool) {
	return k.Policies == nil || slices.Contains(k.Policies, policy),
		k.Providers == nil || slices.Contains(k.Providers, provider)
}

func (v *validator) api() {
	a := v.c.API
	v.addr("api.addr", a.Addr, "the API")
	v.check(a.Addr == "" || len(a.Keys) > 0 || v.c.src.failedAt("api.keys"), "api.keys",
		"at least one key is needed when api.addr is set (every request must carry one)")
	owner := map[Secret]string{}
	for _, name := range slices.Sorted(maps.Keys(a.Keys)) {
		path, k := join("api.keys", name), a.Keys[name]
		v.check(validName.MatchString(name), path, "a key's name must be %s (got %s)", nameRule, quote(name))
		if v.c.src.isUnresolved(path+".key") || v.c.src.failedAt(path+".key") {
			// not resolved (enqueue needs no API key), or reported already
		} else if len(k.Key) < MinAPIKeyLen || strings.ContainsFunc(string(k.Key), func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsGraphic(r) || r == ' ' }) {
			v.failf(path+".key", "must be at least %d printable ASCII characters without spaces, e.g. from openssl rand -hex 32", MinAPIKeyLen)
		} else if other, dup := owner[k.Key]; dup {
			v.failf(path+".key", "the same key as api.keys.%s: give each client a key of its own", other)
		} else {
			owner[k.Key] = name
		}
		v.tenant(path+".tenant", k.Tenant)
		for i, p := range k.Policies {
			v.ref(fmt.Sprintf("%s.policies[%d]", path, i), "policy", p)
		}
		for i, p := range k.Providers {
			v.ref(fmt.Sprintf("%s.providers[%d]", path, i), "provider", p)
		}
		finite := !math.IsInf(k.Rate, 0) && !math.IsNaN(k.Rate)
		v.check(finite && k.Rate >= throttle.MinRate && k.Rate <= throttle.MaxRate, path+".rate",
			"must be from %g to %g notifications per second (got %v)", throttle.MinRate, throttle.MaxRate, k.Rate)
		v.positive(path+".burst", k.Burst)
	}
}

// addr checks a listening address, "" turning what serves there off, and
// reports whether it is one.
func (v *validator) addr(path, addr, what string) bool {
	ok := addr == "" || redisconn.ValidAddr(addr)
	v.check(ok, path, `must be host:port, or "" to turn %s off (got %s)`, what, quote(addr))
	return ok
}
