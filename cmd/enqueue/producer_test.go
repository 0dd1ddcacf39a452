package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoProviderSecretsNeeded: a webhook whose URL and header are secrets
// of the workers' hosts ({env:}, {file:}) unset here; enqueue sends nothing,
// so it enqueues all the same, one notification and a file of them.
func TestNoProviderSecretsNeeded(t *testing.T) {
	h := newHarness(t)
	path := filepath.Join(t.TempDir(), "producer.yaml")
	err := os.WriteFile(path, []byte(`providers:
  hook:
    type: webhook
    url: {file: /run/secrets/hook-url}
    headers:
      Authorization: {env: HOOK_TOKEN}
    rate: 10
    burst: 10
policies:
  marketing: [{limit: 1, per: 24h}]
defaults: {policy: marketing, provider: hook}
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	one := h.run(invocation{args: []string{"-config", path, "-to", "alice@example.com", "-template", "welcome"}})
	if one.code != 0 || !uuidLine.MatchString(one.stdout) || one.stderr != "" {
		t.Fatalf("enqueue = %d, stdout %q, stderr %q; want 0 and a task ID", one.code, one.stdout, one.stderr)
	}
	file := h.run(invocation{args: []string{"-config", path, "-file", "-"},
		stdin: strings.NewReader(`{"recipient":"bob@example.com","template":"welcome"}` + "\n")})
	if file.code != 0 {
		t.Fatalf("enqueue -file = %d, stderr %q", file.code, file.stderr)
	}
	wantPending(t, h, map[string]int{"default": 2})
	// A name is still checked.
	bad := h.run(invocation{args: []string{"-config", path, "-to", "alice@example.com", "-template", "welcome", "-provider", "sms"}})
	want := `provider "sms" is not defined in ` + path + " (defined: hook)\n"
	if bad.code != 1 || !strings.HasSuffix(bad.stderr, want) {
		t.Errorf("enqueue -provider sms = %d, stderr %q; want 1 and %q", bad.code, bad.stderr, want)
	}
}
