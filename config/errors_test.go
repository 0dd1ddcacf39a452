package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/notify-throttle/throttler/throttle"
)

// noEnv is an environment with nothing set.
func noEnv(string) string { return "" }

// TestLoadErrors loads one small file per mistake and checks the whole
// message, file, line, path and bad value included.
func TestLoadErrors(t *testing.T) {
	tests := []struct {
		file string
		want string
	}{
		{"unknown_key.yaml", `testdata/unknown_key.yaml:2: worker.concurency: unknown key (did you mean concurrency?)`},
		{"unknown_section.yaml", `testdata/unknown_section.yaml:3: metrics: unknown key (known: redis, worker, policies, providers, defaults, campaigns)`},
		{"bad_duration.yaml", `testdata/bad_duration.yaml:5: providers.sms.timeout: not a duration such as 500ms, 90s, 1h30m or 7d (got "5 seconds")`},
		{"zero_limit.yaml", `testdata/zero_limit.yaml:4: policies.marketing[1].limit: must be > 0 (got 0)`},
		{"zero_per.yaml", `testdata/zero_per.yaml:4: policies.marketing[1].per: must be > 0 (got 0s)`},
		{"short_window.yaml", `testdata/short_window.yaml:3: policies.burst[0].per: must be at least 1ms (got 500µs)`},
		{"negative_rate.yaml", `testdata/negative_rate.yaml:4: providers.console.rate: must be > 0 (got -1)`},
		{"zero_burst.yaml", `testdata/zero_burst.yaml:5: providers.console.burst: must be > 0 (got 0)`},
		{"zero_concurrency.yaml", `testdata/zero_concurrency.yaml:2: worker.concurrency: must be > 0 (got 0)`},
		{"negative_duration.yaml", `testdata/negative_duration.yaml:3: worker.jitter: must not be negative (got -1s)`},
		{"short_remember_takes.yaml", `testdata/short_remember_takes.yaml:3: worker.remember_takes: must be at least 1s (got 500ms)`},
		{"undefined_policy.yaml", `testdata/undefined_policy.yaml:7: defaults.policy: policy "marketting" is not defined (defined: marketing, transactional)`},
		{"undefined_provider.yaml", `testdata/undefined_provider.yaml:4: defaults.provider: provider "email" is not defined (defined: console)`},
		{"undefined_queue.yaml", `testdata/undefined_queue.yaml:2: defaults.queue: queue "bulk" is not defined (defined: critical, default, low)`},
		{"missing_default_queue.yaml", `testdata/missing_default_queue.yaml:3: defaults.queue: queue "default" is not defined (defined: critical, low)`},
		{"webhook_without_url.yaml", `testdata/webhook_without_url.yaml:2: providers.sms.url: required for a webhook provider`},
		{"bad_provider_type.yaml", `testdata/bad_provider_type.yaml:3: providers.sms.type: must be log or webhook (got "smtp")`},
		{"missing_burst.yaml", `testdata/missing_burst.yaml:2: providers.console.burst: required`},
		{"log_with_url.yaml", `testdata/log_with_url.yaml:4: providers.console.url: only for a webhook provider`},
		{"bad_webhook_url.yaml", `testdata/bad_webhook_url.yaml:4: providers.sms.url: must be an http:// or https:// URL (got "ftp://files.example.com/send")`},
		{"string_limit.yaml", `testdata/string_limit.yaml:3: policies.marketing[0].limit: must be an integer (got "one")`},
		{"string_rate.yaml", `testdata/string_rate.yaml:4: providers.console.rate: must be a number (got "50")`},
		{"section_not_mapping.yaml", `testdata/section_not_mapping.yaml:1: worker: must be a mapping (got 20)`},
		{"duplicate_key.yaml", `testdata/duplicate_key.yaml:4: worker.concurrency: duplicate key (first at line 2)`},
		{"empty.yaml", `testdata/empty.yaml:1: empty: no settings (see the example config.yaml)`},
		{"comments_only.yaml", `testdata/comments_only.yaml:1: empty: no settings (see the example config.yaml)`},
		// yaml's own line: for some syntax errors it is that of the
		// construct around the mistake, the line before it here.
		{"syntax_error.yaml", `testdata/syntax_error.yaml:2: found a tab character that violates indentation`},
		{"unquoted_colon.yaml", `testdata/unquoted_colon.yaml:2: mapping values are not allowed in this context`},
		{"control_character.yaml", `testdata/control_character.yaml:3: control characters are not allowed`},
		{"two_documents.yaml", `testdata/two_documents.yaml:3: a second YAML document: put every setting in one`},
		{"bad_redis_scheme.yaml", `testdata/bad_redis_scheme.yaml:2: redis.url: must be embedded or a redis://, rediss:// or unix:// URL (got "http://127.0.0.1:6379")`},
		{"bad_redis_db.yaml", `testdata/bad_redis_db.yaml:2: redis.url: invalid database number: "first" (got "redis://cache.internal:6379/first")`},
		{"url_and_cluster.yaml", `testdata/url_and_cluster.yaml:3: redis.cluster: cannot be used with redis.url: give one of them`},
		{"bad_cluster_addr.yaml", `testdata/bad_cluster_addr.yaml:2: redis.cluster[1]: must be host:port (got "10.0.0.2")`},
		{"public_embedded_addr.yaml", `testdata/public_embedded_addr.yaml:3: redis.embedded_addr: must be a loopback host:port such as 127.0.0.1:6390, as the embedded server has no password (got "0.0.0.0:6390")`},
		{"bad_prefix.yaml", `testdata/bad_prefix.yaml:2: redis.prefix: must not contain '{' or '}' (got "{throttle}:")`},
		{"bad_metrics_addr.yaml", `testdata/bad_metrics_addr.yaml:2: worker.metrics_addr: must be a string (got 9464)`},
		{"bad_policy_name.yaml", `testdata/bad_policy_name.yaml:3: policies.daily limit: quota name "daily limit": must be 1-64 of A-Z a-z 0-9 _ . -`},
		{"empty_policy.yaml", `testdata/empty_policy.yaml:2: policies.marketing: needs at least one window, e.g. [{limit: 1, per: 24h}]`},
		{"campaign_undefined_policy.yaml", `testdata/campaign_undefined_policy.yaml:12: campaigns[0].policy: policy "newsletter" is not defined (defined: marketing)`},
		{"campaign_without_policy.yaml", `testdata/campaign_without_policy.yaml:4: campaigns[0].policy: required, as defaults.policy is not set`},
		{"secret_env_missing.yaml", `testdata/secret_env_missing.yaml:6: providers.sms.headers.Authorization: environment variable SMS_AUTH is not set or empty`},
		{"secret_file_missing.yaml", `testdata/secret_file_missing.yaml:6: providers.sms.headers.X-Api-Key: cannot read "testdata/no_such_secret.txt": no such file or directory`},
		{"secret_file_two_lines.yaml", `testdata/secret_file_two_lines.yaml:5: providers.sms.headers.Authorization: "testdata/secret_two_lines.txt" holds more than one line: put the header value alone on one line`},
		{"secret_env_and_file.yaml", `testdata/secret_env_and_file.yaml:7: providers.sms.headers.Authorization: give one of {env: NAME} and {file: PATH}`},
		{"secret_unknown_key.yaml", `testdata/secret_unknown_key.yaml:4: providers.sms.url.environ: unknown key (known: env, file)`},
		{"redis_password_env_missing.yaml", `testdata/redis_password_env_missing.yaml:3: redis.password: environment variable CACHE_PASSWORD is not set or empty`},
		{"many_mistakes.yaml", `testdata/many_mistakes.yaml:4: worker.concurency: unknown key (did you mean concurrency?)
testdata/many_mistakes.yaml:5: worker.jitter: not a duration such as 500ms, 90s, 1h30m or 7d (got "soon")
testdata/many_mistakes.yaml:8: policies.marketing[0].limit: must be > 0 (got 0)
testdata/many_mistakes.yaml:10: providers.sms.url: required for a webhook provider
testdata/many_mistakes.yaml:13: providers.sms.burst: must be > 0 (got 0)
testdata/many_mistakes.yaml:15: defaults.policy: policy "marketting" is not defined (defined: marketing)`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, err := LoadWithEnv(filepath.Join("testdata", tt.file), noEnv)
			if err == nil {
				t.Fatalf("Load succeeded, want error:\n%s\ngot config %+v", tt.want, c)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("wrong error\n got: %s\nwant: %s", got, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != filepath.Join("testdata", tt.file) || e.Line < 1 {
				t.Errorf("errors.As(*Error) = %+v, want one naming the file and a line", e)
			}
		})
	}
}

// TestEveryTestdataFileTested keeps the table and the directory in step.
func TestEveryTestdataFileTested(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, f := range files {
		if _, err := LoadWithEnv(f, noEnv); err == nil {
			t.Errorf("%s loads without error: every testdata file is one mistake", f)
		}
	}
}

func TestRuleErrorWrapsThrottle(t *testing.T) {
	_, err := LoadWithEnv("testdata/bad_policy_name.yaml", noEnv)
	if !errors.Is(err, throttle.ErrInvalidRule) {
		t.Errorf("error %v does not wrap throttle.ErrInvalidRule", err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}
