package config

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/throttle"
)

// noSecret fails the test if s shows any of the secrets, escaped or not.
func noSecret(t *testing.T, what, s string, secrets ...string) {
	t.Helper()
	for _, secret := range secrets {
		for _, form := range []string{secret, url.PathEscape(secret), url.QueryEscape(secret)} {
			if strings.Contains(s, form) {
				t.Errorf("%s shows the password %q: %s", what, secret, s)
			}
		}
	}
}

// TestRedisStringsHideSecrets prints a Redis every way a log line might.
func TestRedisStringsHideSecrets(t *testing.T) {
	const secret = "s3cr3t-Value"
	tests := []struct {
		name string
		r    Redis
		want string // String()
	}{
		{"URL", Redis{URL: "redis://app:" + secret + "@cache:6379/0"}, "redis://app:xxxxx@cache:6379/0"},
		{"malformed URL", Redis{URL: "redis://app:" + secret + "/x@cache:port"}, "redis://app:xxxxx@cache:port"},
		{"password setting", Redis{URL: "rediss://cache:6380", Username: "app", Password: secret}, "rediss://cache:6380, user app"},
		{"cluster", Redis{Cluster: []string{"10.0.0.1:7000", "10.0.0.2:7000"}, Username: "app", Password: secret, TLS: TLS{Enabled: true}},
			"cluster 10.0.0.1:7000,10.0.0.2:7000, user app, TLS"},
		{"cluster entry with a password", Redis{Cluster: []string{"app:" + secret + "@10.0.0.1:7000"}}, "cluster app:xxxxx@10.0.0.1:7000"},
		{"not verified", Redis{URL: "rediss://cache:6380", TLS: TLS{InsecureSkipVerify: true}}, "rediss://cache:6380, TLS NOT VERIFIED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			c := Default()
			c.Redis = tt.r
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
				noSecret(t, verb+" of the Redis", fmt.Sprintf(verb, tt.r), secret)
				noSecret(t, verb+" of the Config", fmt.Sprintf(verb, c), secret)
			}
			noSecret(t, "Validate", fmt.Sprint(c.Validate()), secret)
		})
	}
}

// TestPasswordSettingsNeverInErrors checks messages about the password
// settings and the environment, which must name them, not show them.
func TestPasswordSettingsNeverInErrors(t *testing.T) {
	const secret = "s3cr3t-Value"
	dir := t.TempDir()
	twoLines := filepath.Join(dir, "two-lines")
	writeFile(t, twoLines, secret+"\n"+secret+"\n")
	yaml := filepath.Join(dir, "c.yaml")
	tests := []struct {
		name string
		file string
		env  map[string]string
		want string
	}{
		{"REDIS_PASSWORD and a URL password", "redis:\n  url: redis://app:" + secret + "@cache:6379\n",
			map[string]string{EnvRedisPassword: secret + "2"},
			"REDIS_PASSWORD: cannot be used with a password in redis.url: give it once"},
		{"REDIS_URL password and a password setting", "redis:\n  password: " + secret + "\n",
			map[string]string{EnvRedisURL: "redis://app:" + secret + "2@cache:6379"},
			yaml + ":2: redis.password: cannot be used with a password in REDIS_URL: give it once"},
		{"REDIS_PASSWORD with embedded", "redis:\n  url: embedded\n",
			map[string]string{EnvRedisPassword: secret},
			"REDIS_PASSWORD: only for a Redis server: the embedded one has no users, passwords or TLS"},
		{"password file of two lines", "redis:\n  url: redis://cache:6379\n  password_file: two-lines\n", nil,
			yaml + `:3: redis.password_file: "` + twoLines + `" holds more than one line: put the password alone on one line`},
		{"cluster entry with a password", "redis:\n  cluster: [\"app:" + secret + "@10.0.0.1\"]\n", nil,
			yaml + `:2: redis.cluster[0]: must be host:port (got "app:xxxxx@10.0.0.1")`},
		{"cluster entry as a URL", "redis:\n  cluster: [\"redis://app:" + secret + "@10.0.0.1:7000\"]\n", nil,
			yaml + `:2: redis.cluster[0]: must be host:port (got "redis://app:xxxxx@10.0.0.1:7000")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			writeFile(t, yaml, tt.file)
			_, err := LoadWithEnv(yaml, env(tt.env))
			if err == nil || err.Error() != tt.want {
				t.Errorf("got  %v\nwant %s", err, tt.want)
			}
			if err != nil {
				noSecret(t, "error", err.Error(), secret, secret+"2")
			}
		})
	}
}

// TestRedisSecuritySettingsLoad loads a file using every new setting.
func TestRedisSecuritySettingsLoad(t *testing.T) {
	dir := t.TempDir()
	f, err := redistest.NewTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "pw"), "pw\n")
	path := filepath.Join(dir, "c.yaml")
	writeFile(t, path, `redis:
  cluster: ["10.0.0.1:7000", "10.0.0.2:7000"]
  username: throttler
  password_file: pw
  tls:
    enabled: true
    ca_file: ca.pem
    cert_file: client.pem
    key_file: `+f.ClientKeyFile+`
    server_name: redis.internal
`)
	c, err := LoadWithEnv(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := Redis{
		Cluster:      []string{"10.0.0.1:7000", "10.0.0.2:7000"},
		Username:     "throttler",
		PasswordFile: filepath.Join(dir, "pw"),
		TLS: TLS{Enabled: true, CAFile: f.CAFile, CertFile: f.ClientCertFile, KeyFile: f.ClientKeyFile,
			ServerName: "redis.internal"},
		EmbeddedAddr: redisconn.DefaultEmbeddedAddr,
		Prefix:       throttle.DefaultPrefix,
	}
	if got := c.Redis; got.GoString() != want.GoString() {
		t.Errorf("Redis\n got: %#v\nwant: %#v", got, want)
	}
	if pw, err := c.Redis.LoginPassword(); pw != "pw" || err != nil {
		t.Errorf("LoginPassword() = %q, %v", pw, err)
	}
	if _, err := os.Stat(c.Redis.PasswordFile); err != nil {
		t.Error(err)
	}
}
