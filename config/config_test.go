package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/throttle"
)

// env returns a getenv that knows only vars.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// TestLoadRootConfig loads the repository's config.yaml, the default
// configuration, and checks every value.
func TestLoadRootConfig(t *testing.T) {
	c, err := LoadWithEnv("../config.yaml", noEnv)
	if err != nil {
		t.Fatalf("config.yaml does not load:\n%v", err)
	}
	c.src = nil
	want := &Config{
		Redis: Redis{URL: Embedded, EmbeddedAddr: "127.0.0.1:6390", Prefix: "throttle:"},
		Worker: Worker{
			Concurrency:     20,
			Queues:          map[string]int{"critical": 6, "default": 3, "low": 1},
			ShutdownTimeout: 10 * time.Second,
			PollInterval:    100 * time.Millisecond,
			HTTPAddr:        "127.0.0.1:9464",
			Dashboard:       Dashboard{Enabled: true, SecretEnv: "THROTTLER_DASHBOARD_SECRET"},
			InlineWait:      2500 * time.Millisecond,
			BookAhead:       5 * time.Second,
			Book:            true,
			PriorityQueues:  []string{"critical"},
			Jitter:          time.Second,
			SentMarks:       time.Hour,
			RememberTakes:   2 * time.Second,
			WindowMargin:    250 * time.Millisecond,
			DeadAfter:       5 * time.Second,
		},
		Policies: map[string]Policy{
			"marketing":     {Windows: []throttle.Window{{Limit: 1, Per: 24 * time.Hour}, {Limit: 3, Per: 168 * time.Hour}}, OverCap: OverCapDefer},
			"transactional": {Windows: []throttle.Window{{Limit: 20, Per: time.Hour}}, OverCap: OverCapDefer},
		},
		Providers: map[string]Provider{
			"console": {Type: ProviderLog, Output: "stdout", Rate: 50, Burst: 10, PriorityReserve: 2},
			"sms":     {Type: ProviderWebhook, URL: "http://127.0.0.1:8080/send", Timeout: 5 * time.Second, Rate: 100, Burst: 20, PriorityReserve: 4},
		},
		Defaults: Defaults{Policy: "marketing", Provider: "console", Queue: "default"},
		Tenants:  Tenants{Weights: map[string]int{}},
		Events: Events{History: 7 * 24 * time.Hour, HistoryLimit: 100, Callbacks: map[string]Callback{},
			Backoff: 10 * time.Second, MaxBackoff: 10 * time.Minute, GiveUp: 72 * time.Hour},
		Log: Log{Format: LogText, Level: "info"},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("config.yaml (-want +got):\n-%+v\n+%+v", want, c)
	}
}

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

// TestParseValid checks files that load, and what they load to.
func TestParseValid(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, c *Config)
	}{
		{"absent keys keep their defaults", "worker:\n  concurrency: 5\n", func(t *testing.T, c *Config) {
			want := Default().Worker
			want.Concurrency = 5
			if !reflect.DeepEqual(c.Worker, want) {
				t.Errorf("worker = %+v, want %+v", c.Worker, want)
			}
		}},
		{"days in durations", "policies:\n  weekly:\n    - {limit: 3, per: 7d}\n    - {limit: 5, per: 1.5d}\n    - {limit: 9, per: 1d12h30m}\n", func(t *testing.T, c *Config) {
			want := Policy{Windows: []throttle.Window{{Limit: 3, Per: 168 * time.Hour}, {Limit: 5, Per: 36 * time.Hour}, {Limit: 9, Per: 36*time.Hour + 30*time.Minute}}, OverCap: OverCapDefer}
			if got := c.Policies["weekly"]; !reflect.DeepEqual(got, want) {
				t.Errorf("weekly = %v, want %v", got, want)
			}
		}},
		{"a policy's long form", "policies:\n  marketing:\n    windows: [{limit: 1, per: 24h}]\n    max_delay: 2h\n  promo:\n    windows: [{limit: 2, per: 1h}]\n    over_cap: drop\n    counts_toward: [marketing]\n    shadow: true\n", func(t *testing.T, c *Config) {
			want := map[string]Policy{
				"marketing": {Windows: []throttle.Window{{Limit: 1, Per: 24 * time.Hour}}, OverCap: OverCapDefer, MaxDelay: 2 * time.Hour},
				"promo": {Windows: []throttle.Window{{Limit: 2, Per: time.Hour}}, OverCap: OverCapDrop,
					CountsToward: []string{"marketing"}, Shadow: true},
			}
			if !reflect.DeepEqual(c.Policies, want) {
				t.Errorf("policies = %+v, want %+v", c.Policies, want)
			}
		}},
		{"tenant weights", "tenants:\n  weights: {billing: 2, \"team a\": 1000}\n", func(t *testing.T, c *Config) {
			if want := map[string]int{"billing": 2, "team a": 1000}; !reflect.DeepEqual(c.Tenants.Weights, want) {
				t.Errorf("tenants.weights = %v, want %v", c.Tenants.Weights, want)
			}
		}},
		{"a provider in shadow mode", "providers:\n  sms: {type: log, rate: 1, burst: 1, shadow: true}\n", func(t *testing.T, c *Config) {
			if !c.Providers["sms"].Shadow {
				t.Errorf("sms = %+v, want shadow", c.Providers["sms"])
			}
		}},
		{"calendar windows, quiet hours and a zone", "policies:\n  marketing:\n    calendar: [{limit: 1, per: day}, {limit: 3, per: week, week_start: sunday}, {limit: 10, per: month}]\n    quiet: [\"21:00-08:00\", \"sun 00:00-24:00\"]\n    timezone: America/New_York\n", func(t *testing.T, c *Config) {
			cals, quiet, loc, err := c.Local("marketing")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, cal := range cals {
				got = append(got, cal.Name()+": "+cal.String())
			}
			want := []string{"marketing.day: 1 per calendar day", "marketing.week.sunday: 3 per calendar week from Sunday", "marketing.month: 10 per calendar month"}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("calendars %q, want %q", got, want)
			}
			if quiet == nil || quiet.String() != "quiet 21:00-08:00, sun 00:00-24:00" || loc.String() != "America/New_York" {
				t.Errorf("quiet %v in %v", quiet, loc)
			}
			if qs, _, _ := c.Rules(); qs["marketing"] != nil {
				t.Errorf("a policy of calendar windows alone has a rolling quota: %v", qs["marketing"])
			}
		}},
		{"empty metrics_addr turns metrics off", "worker:\n  metrics_addr: \"\"\n", func(t *testing.T, c *Config) {
			if c.Worker.HTTPAddr != "" {
				t.Errorf("metrics_addr = %q, want off", c.Worker.HTTPAddr)
			}
		}},
		{"metrics_addr with no value turns metrics off", "worker:\n  metrics_addr:\n", func(t *testing.T, c *Config) {
			if c.Worker.HTTPAddr != "" {
				t.Errorf("metrics_addr = %q, want off", c.Worker.HTTPAddr)
			}
		}},
		{"a file without book books, as config.yaml recommends", "worker:\n  concurrency: 5\n", func(t *testing.T, c *Config) {
			if !c.Worker.Book {
				t.Errorf("book = false, want the recommended default, true")
			}
		}},
		{"book: false turns booking off", "worker:\n  book: false\n", func(t *testing.T, c *Config) {
			if c.Worker.Book {
				t.Errorf("book = true, want false as the file says")
			}
		}},
		{"zero inline_wait and jitter stay zero", "worker:\n  inline_wait: 0s\n  jitter: 0\n", func(t *testing.T, c *Config) {
			if c.Worker.InlineWait != 0 || c.Worker.Jitter != 0 {
				t.Errorf("inline_wait, jitter = %v, %v, want 0, 0", c.Worker.InlineWait, c.Worker.Jitter)
			}
		}},
		{"queues replace the default", "worker:\n  queues: {bulk: 1}\ndefaults:\n  queue: bulk\n", func(t *testing.T, c *Config) {
			if want := map[string]int{"bulk": 1}; !reflect.DeepEqual(c.Worker.Queues, want) {
				t.Errorf("queues = %v, want %v", c.Worker.Queues, want)
			}
		}},
		{"cluster replaces embedded", "redis:\n  cluster: [\"10.0.0.1:7000\", \"10.0.0.2:7000\"]\n", func(t *testing.T, c *Config) {
			if c.Redis.URL != "" || len(c.Redis.Cluster) != 2 || c.Redis.IsEmbedded() {
				t.Errorf("redis = %+v, want the cluster only", c.Redis)
			}
		}},
		{"redis URL with user and password", "redis:\n  url: rediss://app:s3cret@cache.internal:6380/2\n", func(t *testing.T, c *Config) {
			if got, want := c.Redis.String(), "rediss://app:xxxxx@cache.internal:6380/2"; got != want {
				t.Errorf("String() = %q, want %q", got, want)
			}
		}},
		{"webhook headers and a fraction rate", "providers:\n  hook:\n    type: webhook\n    url: https://example.com/send\n    rate: 0.5\n    burst: 1\n    headers: {Authorization: Bearer abc, X-Tenant: \"7\"}\n", func(t *testing.T, c *Config) {
			p := c.Providers["hook"]
			if p.Rate != 0.5 || p.Timeout != 5*time.Second || p.Headers["Authorization"] != "Bearer abc" || p.Headers["X-Tenant"] != "7" {
				t.Errorf("hook = %+v", p)
			}
		}},
		{"anchors and aliases", "policies:\n  marketing: &m\n    - {limit: 1, per: 24h}\n  promo: *m\n", func(t *testing.T, c *Config) {
			if !reflect.DeepEqual(c.Policies["promo"], c.Policies["marketing"]) {
				t.Errorf("promo = %v, want marketing's %v", c.Policies["promo"], c.Policies["marketing"])
			}
		}},
		{"campaign", `policies:
  marketing: [{limit: 1, per: 24h}]
providers:
  console: {type: log, rate: 1, burst: 1}
defaults: {policy: marketing, provider: console}
campaigns:
  - name: weekly-digest
    cron: "0 9 * * MON"
    timezone: Europe/Paris
    audience: {redis_set: "digest:subscribers"}
    template: digest
    data: {title: Your week, items: [1, 2]}
    send_by_window: 6h
`, func(t *testing.T, c *Config) {
			want := []Campaign{{
				Name: "weekly-digest", Cron: "0 9 * * MON", Timezone: "Europe/Paris",
				Audience: Audience{RedisSet: "digest:subscribers"}, Template: "digest",
				Data: []byte(`{"items":[1,2],"title":"Your week"}`), SendByWindow: 6 * time.Hour,
				CatchUp: time.Hour, Tenant: "weekly-digest",
			}}
			if !reflect.DeepEqual(c.Campaigns, want) {
				t.Errorf("campaigns:\n got %+v\nwant %+v", c.Campaigns, want)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("test.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tt.check(t, c)
		})
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"500ms", 500 * time.Millisecond, true},
		{"1h30m", 90 * time.Minute, true},
		{"168h", 168 * time.Hour, true},
		{"0", 0, true},
		{"7d", 7 * 24 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{".5d", 12 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"-2d", -48 * time.Hour, true},
		{"+1d", 24 * time.Hour, true},
		{"0d", 0, true},
		{"d", 0, false},
		{"1h2d", 0, false},
		{"1d2d", 0, false},
		{"1d-5h", 0, false},
		{"1e3d", 0, false},
		{"5 seconds", 0, false},
		{"5", 0, false},
		{"", 0, false},
		{"107000d", 0, false}, // overflows
		{"106751d23h47m16.854775807s", 1<<63 - 1, true},
		{"106751d23h47m16.854775808s", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseDuration(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("parseDuration(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestRedisURLFromEnvironment(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		env     map[string]string
		wantURL string
		wantErr string
	}{
		{"unset keeps the file's", "redis:\n  url: redis://file:6379/0\n", nil, "redis://file:6379/0", ""},
		{"set replaces url", "redis:\n  url: redis://file:6379/0\n", map[string]string{"REDIS_URL": "redis://env:6379/1"}, "redis://env:6379/1", ""},
		{"set replaces cluster", "redis:\n  cluster: [\"10.0.0.1:7000\"]\n", map[string]string{"REDIS_URL": "redis://env:6379/1"}, "redis://env:6379/1", ""},
		{"set to embedded", "redis:\n  url: redis://file:6379/0\n", map[string]string{"REDIS_URL": "embedded"}, Embedded, ""},
		{"bad one names REDIS_URL", "worker:\n  concurrency: 1\n", map[string]string{"REDIS_URL": "http://u:s3cret@h"},
			"", `REDIS_URL: must be embedded or a redis://, rediss:// or unix:// URL (got "http://u:xxxxx@h")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/config.yaml"
			writeFile(t, path, tt.yaml)
			c, err := LoadWithEnv(path, env(tt.env))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Redis.URL != tt.wantURL || c.Redis.Cluster != nil {
				t.Errorf("redis = %+v, want url %q and no cluster", c.Redis, tt.wantURL)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := LoadWithEnv("testdata/no_such_file.yaml", noEnv)
	if err == nil || !strings.Contains(err.Error(), "testdata/no_such_file.yaml") {
		t.Errorf("error = %v, want one naming the file", err)
	}
}

func TestRules(t *testing.T) {
	c, err := LoadWithEnv("../config.yaml", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	quotas, buckets, err := c.Rules()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for name, q := range quotas {
		got["quota "+name] = q.Name() + ": " + q.String()
	}
	for name, b := range buckets {
		got["bucket "+name] = b.Name() + ": " + b.String()
	}
	want := map[string]string{
		"quota marketing":     "marketing: 1 per 24h, 3 per 168h",
		"quota transactional": "transactional: 20 per 1h",
		"bucket console":      "console: 50/s burst 10",
		"bucket sms":          "sms: 100/s burst 20",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rules:\n got %v\nwant %v", got, want)
	}
}

// TestBuiltInCode checks Validate and Rules on a Config not read from a
// file: the same messages, without a file and line.
func TestBuiltInCode(t *testing.T) {
	c := Default()
	c.Worker.Concurrency = 0
	c.Policies["bad name"] = Policy{Windows: []throttle.Window{{Limit: 1, Per: time.Hour}}}
	c.Providers["sms"] = Provider{Type: ProviderWebhook, Rate: 1, Burst: 1}
	want := strings.Join([]string{
		"worker.concurrency: must be > 0 (got 0)",
		"providers.sms.url: required for a webhook provider",
		"providers.sms.timeout: must be > 0 (got 0s)",
		`policies.bad name: quota name "bad name": must be 1-64 of A-Z a-z 0-9 _ . -`,
	}, "\n")
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate() =\n%v\nwant\n%s", err, want)
	}
	_, _, err := c.Rules()
	if want := `policies.bad name: quota name "bad name": must be 1-64 of A-Z a-z 0-9 _ . -`; err == nil || err.Error() != want {
		t.Errorf("Rules() = %v, want %s", err, want)
	}
}

func TestManyErrorsAreCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("worker:\n")
	for i := range 30 {
		fmt.Fprintf(&b, "  key%d: 1\n", i)
	}
	_, err := Parse("big.yaml", []byte(b.String()))
	lines := strings.Split(fmt.Sprint(err), "\n")
	if len(lines) != maxErrors+1 {
		t.Fatalf("%d lines, want %d:\n%v", len(lines), maxErrors+1, err)
	}
	if got, want := lines[maxErrors], "big.yaml:22: and 10 more problems"; got != want {
		t.Errorf("last line = %q, want %q", got, want)
	}
}

// TestRoute checks that the defaults fill what a notification or a
// campaign leaves empty, and only that.
func TestRoute(t *testing.T) {
	c := Default()
	c.Defaults = Defaults{Policy: "marketing", Provider: "console", Queue: "default"}
	tests := []struct{ in, want Route }{
		{Route{}, Route{"marketing", "console", "default"}},
		{Route{Policy: "vip"}, Route{"vip", "console", "default"}},
		{Route{Provider: "sms", Queue: "low"}, Route{"marketing", "sms", "low"}},
		{Route{"vip", "sms", "low"}, Route{"vip", "sms", "low"}},
	}
	for _, tt := range tests {
		if got := c.Route(tt.in); got != tt.want {
			t.Errorf("Route(%+v) = %+v, want %+v", tt.in, got, tt.want)
		}
		cp := Campaign{Policy: tt.in.Policy, Provider: tt.in.Provider, Queue: tt.in.Queue}
		if got := cp.Route(c); got != tt.want {
			t.Errorf("campaign %+v: Route = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}
