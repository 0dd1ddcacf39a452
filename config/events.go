package config

import (
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/lifecycle"
)

// Events says how long each message's events are kept (its history, GET
// /v1/notifications/{id}) and which tenants get them as status callbacks
// (package lifecycle). Read at start; SIGHUP does not change it.
type Events struct {
	History      time.Duration       `yaml:"history"`              // lifecycle.DefaultHistory; at least 1m
	HistoryLimit int                 `yaml:"history_limit"`        // lifecycle.DefaultHistoryLimit; 2 to MaxHistoryLimit
	Callbacks    map[string]Callback `yaml:"callbacks"`            // by tenant ("" the default tenant); default none
	Backoff      time.Duration       `yaml:"callback_backoff"`     // a failed POST's first retry; lifecycle.DefaultBackoff
	MaxBackoff   time.Duration       `yaml:"callback_max_backoff"` // the longest wait between retries; lifecycle.DefaultMaxBackoff
	GiveUp       time.Duration       `yaml:"callback_give_up"`     // an event not delivered by this age is dropped; lifecycle.DefaultGiveUp
}

// Callback is where a tenant's events are POSTed, signed with its secret.
type Callback struct {
	URL     string        `yaml:"url,required"`                           // http:// or https://
	Secret  Secret        `yaml:"secret,required,secret=callback secret"` // signs each POST
	Timeout time.Duration `yaml:"timeout"`                                // one POST's; default lifecycle.DefaultTimeout
}

// MaxHistoryLimit bounds events.history_limit: a history is read whole by
// GET.
const MaxHistoryLimit = 10000

// MinCallbackSecretLen is the shortest callback secret accepted: a
// generated one (openssl rand -hex 32), not a password.
const MinCallbackSecretLen = 16

// defaultEvents are the events' settings of a file that leaves them out.
func defaultEvents() Events {
	return Events{History: lifecycle.DefaultHistory, HistoryLimit: lifecycle.DefaultHistoryLimit, Callbacks: map[string]Callback{},
		Backoff: lifecycle.DefaultBackoff, MaxBackoff: lifecycle.DefaultMaxBackoff, GiveUp: lifecycle.DefaultGiveUp}
}

// Fill gives a callback read from a file its timeout's default.
func (c *Callback) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("timeout") {
		c.Timeout = lifecycle.DefaultTimeout
	}
}

// EventOptions returns the options of the events' Recorder and Dispatcher
// (package lifecycle). A producer's config (LoadProducer, LoadAPI) has no
// callback secrets, which only a worker's Dispatcher needs.
func (c *Config) EventOptions() lifecycle.Options {
	e := c.Events
	o := lifecycle.Options{Prefix: c.Redis.Prefix, History: e.History, HistoryLimit: e.HistoryLimit,
		Backoff: e.Backoff, MaxBackoff: e.MaxBackoff, GiveUp: e.GiveUp, Callbacks: map[string]lifecycle.Endpoint{}}
	for tenant, cb := range e.Callbacks {
		o.Callbacks[tenant] = lifecycle.Endpoint{URL: cb.URL, Secret: string(cb.Secret), Timeout: cb.Timeout}
	}
	return o
}

func (v *validator) events() {
	e := v.c.Events
	v.durationAtLeast("events.history", e.History, time.Minute)
	v.check(e.HistoryLimit >= 2 && e.HistoryLimit <= MaxHistoryLimit, "events.history_limit",
		"must be from 2 (the first event and the latest) to %d (got %d)", MaxHistoryLimit, e.HistoryLimit)
	v.durationAtLeast("events.callback_backoff", e.Backoff, time.Millisecond)
	if e.Backoff > 0 {
		v.check(e.MaxBackoff >= e.Backoff, "events.callback_max_backoff", "must be at least callback_backoff (%s) (got %s)",
			timefmt.Duration(e.Backoff), timefmt.Duration(e.MaxBackoff))
	}
	v.durationAtLeast("events.callback_give_up", e.GiveUp, time.Minute)
	for _, tenant := range slices.Sorted(maps.Keys(e.Callbacks)) {
		path, cb := join("events.callbacks", tenant), e.Callbacks[tenant]
		v.tenant(path, tenant)
		v.check(isHTTPURL(cb.URL), path+".url", "must be an http:// or https:// URL (got %s)", quote(cb.URL))
		if !v.c.src.isUnresolved(path+".secret") && !v.c.src.failedAt(path+".secret") &&
			(len(cb.Secret) < MinCallbackSecretLen || strings.ContainsFunc(string(cb.Secret), func(r rune) bool { return !unicode.IsPrint(r) })) {
			v.failf(path+".secret", "must be at least %d printable characters, e.g. from openssl rand -hex 32", MinCallbackSecretLen)
		}
		v.durationAtLeast(path+".timeout", cb.Timeout, time.Millisecond)
	}
}
