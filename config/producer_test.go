package config

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestProducerLeavesProviderSecretsUnresolved: enqueue (LoadProducer) and
// an API-only process (LoadAPI) load a file whose providers' secrets are
// missing on their host, checking every name; a worker (LoadWithEnv) stops
// at the first missing one, naming it. A malformed reference is a mistake
// for all of them.
func TestProducerLeavesProviderSecretsUnresolved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	writeFile(t, path, `providers:
  hook:
    type: webhook
    url: {file: missing/hook-url}
    headers:
      Authorization: {env: HOOK_TOKEN}
    rate: 10
    burst: 10
defaults: {policy: marketing, provider: hook}
policies:
  marketing: [{limit: 1, per: 24h}]
api:
  addr: 127.0.0.1:8088
  keys:
    billing: {key: {env: BILLING_KEY}, tenant: billing}
`)
	_, err := LoadWithEnv(path, env(map[string]string{"BILLING_KEY": "0123456789abcdef"}))
	want := path + `:4: providers.hook.url: cannot read "` + filepath.Join(dir, "missing/hook-url") + `"`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("LoadWithEnv: error = %v, want one starting %s", err, want)
	}
	for name, load := range map[string]func(string, func(string) string) (*Config, error){"LoadProducer": LoadProducer, "LoadAPI": LoadAPI} {
		c, err := load(path, noEnv)
		if name == "LoadAPI" {
			want := path + ":15: api.keys.billing.key: environment variable BILLING_KEY is not set or empty"
			if err == nil || err.Error() != want {
				t.Fatalf("LoadAPI without the API key: error = %v, want %s", err, want)
			}
			c, err = load(path, env(map[string]string{"BILLING_KEY": "0123456789abcdef"}))
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p := c.Providers["hook"]; p.URL != "" || p.Headers["Authorization"] != "" || p.Type != ProviderWebhook {
			t.Errorf("%s: provider hook = %+v, want its secrets empty", name, p)
		}
	}
	// Names are still checked, and a reference still needs its form.
	writeFile(t, path, `providers:
  hook:
    type: webhook
    url: {env: HOOK_URL, file: hook-url}
    rate: 10
    burst: 10
defaults: {policy: marketing, provider: hook}
`)
	_, err = LoadProducer(path, noEnv)
	want = path + ":4: providers.hook.url: give one of {env: NAME} and {file: PATH}\n" +
		path + ":7: defaults.policy: policy \"marketing\" is not defined (none defined)"
	if err == nil || err.Error() != want {
		t.Errorf("LoadProducer: error = %v, want\n%s", err, want)
	}
}
