package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoProviderSecretsNeeded: a webhook whose URL and header, and services
// whose credentials, are secrets of the workers' hosts ({env:}, {file:})
// unset here; enqueue sends nothing, so it enqueues all the same, one
// notification and a file of them.
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
  push: {type: fcm, project_id: demo-app, token: {env: FCM_TOKEN}, rate: 10, burst: 10}
  sms: {type: twilio, account_sid: AC1, password: {file: /run/secrets/twilio}, from: "+15550001111", rate: 1, burst: 1}
  mail: {type: sendgrid, api_key: {env: SENDGRID_API_KEY}, from: noreply@example.com, rate: 10, burst: 10}
  ses: {type: ses, region: eu-west-1, access_key_id: {env: AWS_ACCESS_KEY_ID}, secret_access_key: {env: AWS_SECRET_ACCESS_KEY}, from: noreply@example.com, rate: 1, burst: 1}
  relay: {type: smtp, host: smtp.example.com, username: {env: SMTP_USER}, password: {env: SMTP_PASSWORD}, from: noreply@example.com, rate: 1, burst: 1}
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
	// Each with a recipient its channel takes (package address).
	for provider, to := range map[string]string{"push": "dXyz", "sms": "+15550100", "mail": "carol@example.com",
		"ses": "dave@example.com", "relay": "erin@example.com"} {
		r := h.run(invocation{args: []string{"-config", path, "-to", to, "-template", "welcome", "-provider", provider}})
		if r.code != 0 || r.stderr != "" {
			t.Errorf("enqueue -provider %s = %d, stderr %q; want 0", provider, r.code, r.stderr)
		}
	}
	wantPending(t, h, map[string]int{"default": 7})
	// A name is still checked.
	bad := h.run(invocation{args: []string{"-config", path, "-to", "alice@example.com", "-template", "welcome", "-provider", "fax"}})
	want := `provider "fax" is not defined in ` + path + " (defined: hook, mail, push, relay, ses, sms)\n"
	if bad.code != 1 || !strings.HasSuffix(bad.stderr, want) {
		t.Errorf("enqueue -provider fax = %d, stderr %q; want 1 and %q", bad.code, bad.stderr, want)
	}
}
