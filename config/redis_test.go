package config

import (
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"embedded", "embedded", "embedded"},
		{"no credentials", "redis://cache:6379/0", "redis://cache:6379/0"},
		{"user only", "redis://app@cache:6379/0", "redis://app@cache:6379/0"},
		{"user and password", "redis://app:s3cret@cache:6379/0", "redis://app:xxxxx@cache:6379/0"},
		{"password only", "redis://:s3cret@cache:6379", "redis://:xxxxx@cache:6379"},
		{"empty password", "redis://app:@cache", "redis://app:xxxxx@cache"},
		{"tls", "rediss://app:s3cret@cache:6380/1", "rediss://app:xxxxx@cache:6380/1"},
		{"escaped characters", "redis://app:p%40ss%2Fw@cache", "redis://app:xxxxx@cache"},
		{"unescaped @ and colon", "redis://app:p@ss:w@cache:6379", "redis://app:xxxxx@cache:6379"},
		{"unescaped slash, not a URL", "redis://app:s3/cret@cache:6379", "redis://app:xxxxx@cache:6379"},
		{"password query parameter", "unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=xxxxx"},
		{"no scheme", "app:s3cret@cache:6379", "app:xxxxx@cache:6379"},
		{"not a URL", "cache:6379", "cache:6379"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RedactURL(tt.in); got != tt.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestPasswordNeverInErrors feeds bad Redis URLs holding a password through
// every way in: the file, REDIS_URL and Connect.
func TestPasswordNeverInErrors(t *testing.T) {
	const secret = "s3cr3t"
	urls := map[string]string{
		"bad port":          "redis://app:" + secret + "@cache:port/0",
		"bad database":      "redis://app:" + secret + "@cache:6379/zero",
		"bad scheme":        "http://app:" + secret + "@cache:6379",
		"unknown option":    "redis://app:" + secret + "@cache:6379/0?bogus=1",
		"slash in password": "redis://app:" + secret + "/x@cache:6379/0",
		"colon in password": "redis://app:" + secret + ":x@cache:port",
		"query password":    "redis://cache:6379/0?password=" + secret,
		"escaped password":  "redis://app:" + secret + "%zz@cache:6379/0",
		"control character": "redis://app:" + secret + "@cache\n:6379/0",
	}
	for name, u := range urls {
		t.Run(name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				if err == nil {
					t.Errorf("%s: no error for %q", how, u)
				} else if strings.Contains(err.Error(), secret) {
					t.Errorf("%s: error shows the password: %v", how, err)
				}
			}
			_, err := Parse("c.yaml", []byte("redis:\n  url: "+quote(u)+"\n"))
			check("Parse", err)
			path := t.TempDir() + "/c.yaml"
			writeFile(t, path, "worker: {concurrency: 1}\n")
			_, err = LoadWithEnv(path, env(map[string]string{"REDIS_URL": u}))
			check("REDIS_URL", err)
		})
	}
}
