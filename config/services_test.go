package config

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/redistest"
)

func TestServiceProvidersLoadWithDefaultsAndSecrets(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "AuthKey.p8")
	file := filepath.Join(dir, "config.yaml")
	yaml := `policies:
  p: [{limit: 1, per: 1h}]
providers:
  mail: {type: smtp, host: smtp.example.com, username: {env: SMTP_USER}, password: {env: SMTP_PASSWORD}, from: a@example.com, rate: 1, burst: 1}
  sms: {type: twilio, account_sid: AC1, password: {env: TWILIO_TOKEN}, messaging_service_sid: MG1, max_retries: 3, backoff: 2s, rate: 1, burst: 1}
  ios: {type: apns, team_id: T, key_id: K, key_file: AuthKey.p8, topic: com.example.app, scope_pause: 30s, rate: 1, burst: 1}
`
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SMTP_USER": "mailer", "SMTP_PASSWORD": "s3cret", "TWILIO_TOKEN": "s3cret-token"}
	c, err := LoadWithEnv(file, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	mail, sms, ios := c.Providers["mail"], c.Providers["sms"], c.Providers["ios"]
	if mail.Port != 587 || mail.TLS != "starttls" || mail.Timeout != 10*time.Second || string(mail.Password) != "s3cret" || string(mail.Username) != "mailer" {
		t.Errorf("smtp: %+v", mail)
	}
	if sms.MaxRetries != 3 || sms.Backoff != 2*time.Second || string(sms.Password) != "s3cret-token" || sms.MessagingServiceSID != "MG1" {
		t.Errorf("twilio: %+v", sms)
	}
	if ios.KeyFile != key || ios.ScopePause != 30*time.Second {
		t.Errorf("apns: key_file %q (want it relative to the config's directory: %q), scope_pause %s", ios.KeyFile, key, ios.ScopePause)
	}
	if shown := fmt.Sprintf("%v %+v %#v", c, c, c); strings.Contains(shown, "s3cret") {
		t.Error("a printed config shows a secret")
	}
}

// TestProviderCAFile: a provider's ca_file, relative to the config's
// directory, gives RootCAs that trust what its CA signed.
func TestProviderCAFile(t *testing.T) {
	dir := t.TempDir()
	f, err := redistest.NewTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	writeFile(t, path, `providers:
  hook: {type: webhook, url: https://hooks.internal/send, ca_file: ca.pem, rate: 1, burst: 1}
  console: {type: log, rate: 1, burst: 1}
`)
	c, err := LoadWithEnv(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	hook := c.Providers["hook"]
	if hook.CAFile != f.CAFile {
		t.Errorf("ca_file %q, want %q", hook.CAFile, f.CAFile)
	}
	roots, err := hook.RootCAs()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _ := os.ReadFile(f.CertFile)
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost"}); err != nil {
		t.Errorf("the ca_file's CA signed a certificate its RootCAs refuse: %v", err)
	}
	if roots, err := c.Providers["console"].RootCAs(); roots != nil || err != nil {
		t.Errorf("no ca_file: %v, %v; want the system's (nil)", roots, err)
	}
}
