package config

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// TestEvents: the events' settings, a callback's secret from the
// environment and its default timeout, become the lifecycle's options
// under the config's prefix.
func TestEvents(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, `redis:
  prefix: "app:"
events:
  history: 2d
  history_limit: 20
  callbacks:
    billing:
      url: https://billing.example.com/events
      secret: {env: BILLING_CALLBACK_SECRET}
    "":
      url: http://127.0.0.1:9000/events
      secret: {env: DEFAULT_CALLBACK_SECRET}
      timeout: 2s
  callback_backoff: 1s
  callback_max_backoff: 1m
  callback_give_up: 1d
`)
	c, err := LoadWithEnv(path, env(map[string]string{"BILLING_CALLBACK_SECRET": "billing-secret-0123456789", "DEFAULT_CALLBACK_SECRET": "default-secret-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	want := lifecycle.Options{Prefix: "app:", History: 48 * time.Hour, HistoryLimit: 20, Backoff: time.Second, MaxBackoff: time.Minute, GiveUp: 24 * time.Hour,
		Callbacks: map[string]lifecycle.Endpoint{
			"billing": {URL: "https://billing.example.com/events", Secret: "billing-secret-0123456789", Timeout: 5 * time.Second},
			"":        {URL: "http://127.0.0.1:9000/events", Secret: "default-secret-0123456789", Timeout: 2 * time.Second},
		}}
	if got := c.EventOptions(); !reflect.DeepEqual(got, want) {
		t.Errorf("EventOptions:\n got %+v\nwant %+v", got, want)
	}
	if d := Default().EventOptions(); d.History != lifecycle.DefaultHistory || d.HistoryLimit != lifecycle.DefaultHistoryLimit || len(d.Callbacks) != 0 {
		t.Errorf("the default's options %+v, want the lifecycle's defaults and no callbacks", d)
	}
	noSecret(t, "the Config", fmt.Sprintf("%v %+v %#v", c, c, c), "billing-secret", "default-secret")
}

// TestProducersLeaveCallbackSecretsUnresolved: enqueue and an API-only
// process record events (they know which tenants have callbacks) but never
// POST them: they load a file whose callback secrets their host lacks.
func TestProducersLeaveCallbackSecretsUnresolved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, `events:
  callbacks:
    billing:
      url: https://billing.example.com/events
      secret: {env: BILLING_CALLBACK_SECRET}
`)
	if _, err := LoadWithEnv(path, noEnv); err == nil {
		t.Fatal("a worker loaded a callback without its secret")
	}
	for name, load := range map[string]func(string, func(string) string) (*Config, error){"LoadProducer": LoadProducer, "LoadAPI": LoadAPI} {
		c, err := load(path, noEnv)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cb, ok := c.EventOptions().Callbacks["billing"]; !ok || cb.Secret != "" || cb.URL != "https://billing.example.com/events" {
			t.Errorf("%s: billing's callback %+v, want its URL and no secret", name, cb)
		}
	}
}
