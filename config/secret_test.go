package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretReferences resolves {env: NAME} and {file: PATH} everywhere a
// secret may be: webhook headers and URL, the Redis password and URL.
func TestSecretReferences(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "api-key"), "key-from-file\n")
	writeFile(t, filepath.Join(dir, "redis-pw"), "redis-from-file\r\n")
	path := filepath.Join(dir, "config.yaml")
	writeFile(t, path, `redis:
  url: {env: CACHE_URL}
  username: app
  password: {file: redis-pw}
providers:
  sms:
    type: webhook
    url: {file: `+filepath.Join(dir, "api-key")+`}
    headers:
      Authorization: {env: SMS_AUTH}
      X-Api-Key: {file: api-key}
      X-Tenant: "7"
    rate: 1
    burst: 1
`)
	// The URL from a file is not a URL: its message names the reference
	// and quotes nothing the file holds.
	_, err := LoadWithEnv(path, env(map[string]string{"CACHE_URL": "redis://cache:6379/0", "SMS_AUTH": "Bearer from-env"}))
	want := path + `:8: providers.sms.url: must be an http:// or https:// URL (got the value of {file: ` + filepath.Join(dir, "api-key") + `})`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %s", err, want)
	}
	writeFile(t, filepath.Join(dir, "api-key"), "https://hook:url-pw@sms.example.com/send\n")
	c, err := LoadWithEnv(path, env(map[string]string{"CACHE_URL": "redis://cache:6379/0", "SMS_AUTH": "Bearer from-env"}))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Providers["sms"]
	wantHeaders := map[string]Secret{"Authorization": "Bearer from-env", "X-Api-Key": "https://hook:url-pw@sms.example.com/send", "X-Tenant": "7"}
	for k, v := range wantHeaders {
		if p.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, string(p.Headers[k]), string(v))
		}
	}
	if p.URL != "https://hook:url-pw@sms.example.com/send" {
		t.Errorf("url = %q", string(p.URL))
	}
	if c.Redis.URL != "redis://cache:6379/0" || c.Redis.Password != "redis-from-file" {
		t.Errorf("redis url, password = %q, %q", c.Redis.URL, c.Redis.Password)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		noSecret(t, verb+" of the Config", fmt.Sprintf(verb, c), "from-env", "url-pw", "redis-from-file", "key-from-file")
	}
}

// TestSecretErrorsNameTheReference checks that a reference that cannot be
// resolved is reported with the variable or file, never with a value, even
// when another secret of the same file resolved.
func TestSecretErrorsNameTheReference(t *testing.T) {
	const secret = "s3cr3t-Value"
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	writeFile(t, path, `providers:
  sms:
    type: webhook
    url: https://sms.example.com/send
    headers:
      Authorization: {env: SMS_AUTH}
      X-Api-Key: {env: SMS_KEY}
    rate: 1
    burst: 1
`)
	_, err := LoadWithEnv(path, env(map[string]string{"SMS_KEY": secret}))
	want := path + ":6: providers.sms.headers.Authorization: environment variable SMS_AUTH is not set or empty"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %s", err, want)
	}
	writeFile(t, path, "providers:\n  sms:\n    type: webhook\n    url: https://sms.example.com/send\n    headers: {X-Api-Key: {env: SMS_KEY}}\n    rate: 1\n    burst: 1\n")
	_, err = LoadWithEnv(path, env(map[string]string{"SMS_KEY": secret + "\nX-Injected: 1"}))
	want = path + ":5: providers.sms.headers.X-Api-Key: must not contain a line break or NUL"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %s", err, want)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error shows the secret: %v", err)
	}
}
