package config

import (
	"strings"
	"testing"
)

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
