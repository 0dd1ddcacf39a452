package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/notify-throttle/throttler/address"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/providers"
)

// TestServicesCheckAddresses: the worker's senders of services refuse a
// recipient their channel cannot take (providers.Addresser, package address)
// and stay Scopers; log providers take anything and are left as they are.
func TestServicesCheckAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.yaml")
	yaml := "redis: {url: \"redis://127.0.0.1:1/0\"}\nworker: {http_addr: \"\"}\n" +
		"policies: {marketing: {windows: [{limit: 1, per: 24h}]}}\n" +
		"providers:\n" +
		"  sms: {type: twilio, account_sid: AC0123456789abcdef0123456789abcdef, password: {env: TEST_TWILIO_TOKEN}, from: \"+14155550100\", rate: 1, burst: 1}\n" +
		"  console: {type: log, output: stderr, rate: 1, burst: 1}\n" +
		"defaults: {policy: marketing, provider: console}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_TWILIO_TOKEN", "token")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rules, _, err := buildRules(cfg, io.Discard, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sms, ok := rules.Providers["sms"].Provider.(interface {
		providers.Scoper
		providers.Addresser
	})
	if !ok {
		t.Fatalf("provider sms is a %T, want a Scoper and an Addresser", rules.Providers["sms"].Provider)
	}
	if err := sms.CheckRecipient("5550100008"); err != address.ErrE164 {
		t.Errorf("sms: CheckRecipient(5550100008) = %v, want %v", err, address.ErrE164)
	}
	if err := sms.CheckRecipient("+14155550100"); err != nil {
		t.Errorf("sms: CheckRecipient(+14155550100) = %v", err)
	}
	if _, ok := rules.Providers["console"].Provider.(providers.Addresser); ok {
		t.Error("provider console (log) checks addresses: it takes any")
	}
}
