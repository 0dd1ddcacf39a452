package config

import (
	"crypto/x509"
	"errors"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/internal/redisconn"
)

// A service's keys (those after Headers in Provider): those every service
// type takes, then each type's own.
var (
	serviceCommon = []string{"timeout", "max_retries", "backoff"}
	serviceTypes  = map[string][]string{
		ProviderSMTP:     {"host", "port", "tls", "username", "password", "from", "quota_reset"},
		ProviderSES:      {"region", "access_key_id", "secret_access_key", "from", "configuration_set", "quota_reset", "base_url", "feedback"},
		ProviderTwilio:   {"account_sid", "username", "password", "from", "messaging_service_sid", "scope_pause", "base_url", "feedback"},
		ProviderFCM:      {"project_id", "credentials_file", "token", "token_url", "base_url"},
		ProviderAPNs:     {"team_id", "key_id", "key_file", "topic", "scope_pause", "base_url"},
		ProviderSendGrid: {"api_key", "from", "from_name", "base_url", "feedback"},
	}
	// serviceRequired are the keys each type needs; the either-or ones
	// are checked by service.
	serviceRequired = map[string][]string{
		ProviderSMTP:     {"host", "from"},
		ProviderSES:      {"region", "access_key_id", "secret_access_key", "from"},
		ProviderTwilio:   {"account_sid", "password"},
		ProviderFCM:      {"project_id"},
		ProviderAPNs:     {"team_id", "key_id", "key_file", "topic"},
		ProviderSendGrid: {"api_key", "from"},
	}
)

// RootCAs returns the CAs p's TLS trusts: the system's and those of its
// ca_file; nil (the system's) without one. Load checked the file already.
func (p Provider) RootCAs() (*x509.CertPool, error) { return certPool(p.CAFile, true) }

// certPool returns the certificates of file, with the system's if system,
// or nil without a file.
func certPool(file string, system bool) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if !system || err != nil {
		pool = x509.NewCertPool()
	}
	if msg := redisconn.AppendCAFile(pool, file); msg != "" {
		return nil, errors.New("ca_file: " + msg)
	}
	return pool, nil
}

// caFile checks the ca_file at path where its files are read: not on a
// producer (LoadProducer), whose host needs none of the workers' files.
func (v *validator) caFile(path, file string) {
	if file != "" && !v.c.src.unresolvedUnder(path) {
		msg := redisconn.AppendCAFile(x509.NewCertPool(), file)
		v.check(msg == "", path, "%s", msg)
	}
}

// fillService gives a service provider its defaults and reports its missing keys.
func (p *Provider) fillService(has func(key string) bool, required func(key, why string)) {
	for _, k := range serviceRequired[p.Type] {
		if !has(k) {
			required(k, " for type "+p.Type)
		}
	}
	if !has("timeout") {
		p.Timeout = 10 * time.Second
	}
	if p.Type == ProviderSMTP {
		if !has("tls") {
			p.TLS = "starttls"
		}
		if !has("port") {
			p.Port = 587
			if p.TLS == "tls" {
				p.Port = 465
			}
		}
	}
}

// serviceKeys returns the service keys pr (at path) sets, in field order:
// those with a value, and secrets a producer left unresolved.
func (v *validator) serviceKeys(path string, pr Provider) []string {
	val, t := reflect.ValueOf(pr), reflect.TypeFor[Provider]()
	var keys []string
	past := false
	for i := range t.NumField() {
		key, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if past && (!val.Field(i).IsZero() || v.c.src.isUnresolved(path+"."+key)) {
			keys = append(keys, key)
		}
		past = past || key == "headers"
	}
	return keys
}

// typesTaking lists the types whose keys, or common, hold key, for an error.
func typesTaking(key string, keys map[string][]string, common []string) string {
	var types []string
	for _, t := range []string{ProviderSMTP, ProviderSES, ProviderTwilio, ProviderFCM, ProviderAPNs, ProviderSendGrid} {
		if slices.Contains(keys[t], key) || keys[t] != nil && slices.Contains(common, key) {
			types = append(types, t)
		}
	}
	return strings.Join(types, ", ")
}

// serviceKeysOnly refuses the service keys pr sets that its type does not take.
func (v *validator) serviceKeysOnly(path string, pr Provider) {
	for _, k := range v.serviceKeys(path, pr) {
		ok := slices.Contains(serviceTypes[pr.Type], k) || serviceTypes[pr.Type] != nil && slices.Contains(serviceCommon, k)
		v.check(ok, path+"."+k, "only for type %s", typesTaking(k, serviceTypes, serviceCommon))
	}
}

// service checks what a service provider's keys must be beyond being set.
func (v *validator) service(path string, pr Provider) {
	v.durationAtLeast(path+".timeout", pr.Timeout, time.Nanosecond)
	v.check(pr.MaxRetries >= 0, path+".max_retries", "must be >= 0 (got %d)", pr.MaxRetries)
	v.check(pr.Backoff >= 0, path+".backoff", "must be >= 0 (got %s)", pr.Backoff)
	v.check(pr.ScopePause >= 0, path+".scope_pause", "must be >= 0 (got %s)", pr.ScopePause)
	v.check(pr.QuotaReset >= 0 && pr.QuotaReset < 24*time.Hour, path+".quota_reset", "must be from 0s to 23h59m59s after 00:00 UTC (got %s)", pr.QuotaReset)
	v.check(pr.BaseURL == "" || isHTTPURL(pr.BaseURL), path+".base_url", "must be an http:// or https:// URL (got %s)", quote(pr.BaseURL))
	switch pr.Type {
	case ProviderSMTP, ProviderSES, ProviderSendGrid:
		v.check(pr.From == "" || strings.Contains(pr.From, "@"), path+".from", "must be an email address (got %s)", quote(pr.From))
	case ProviderTwilio:
		v.check((pr.From == "") != (pr.MessagingServiceSID == ""), path+".from", "give one of from (a number) and messaging_service_sid")
	case ProviderFCM:
		v.check((pr.CredentialsFile != "") != v.given(path+".token", pr.Token), path+".credentials_file", "give one of credentials_file (a service account's JSON key) and token")
	}
	if pr.Type == ProviderSMTP {
		v.check(pr.Port > 0 && pr.Port < 65536, path+".port", "must be from 1 to 65535 (got %d)", pr.Port)
	}
	if slices.Contains(serviceTypes[pr.Type], "feedback") && !v.c.src.failedAt(path+".feedback") {
		v.feedback(path, pr)
	}
}
