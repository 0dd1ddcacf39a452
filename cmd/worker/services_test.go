package main

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/providers"
)

// TestProvidersTrustTheirCAFile: a webhook and a service sending to a
// server whose certificate only their ca_file trusts reach it; the same
// without ca_file reach nothing, and say so as broken.
func TestProvidersTrustTheirCAFile(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"sid":"SM1","id":"hook-1"}`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadYAML(t, dir, fmt.Sprintf(`providers:
  hook: {type: webhook, url: %[1]s/send, ca_file: ca.pem, rate: 1, burst: 1}
  sms: {type: twilio, account_sid: AC1, password: token, from: "+15550001111", base_url: %[1]s, ca_file: ca.pem, rate: 1, burst: 1}
  hook_untrusting: {type: webhook, url: %[1]s/send, rate: 1, burst: 1}
  sms_untrusting: {type: twilio, account_sid: AC1, password: token, from: "+15550001111", base_url: %[1]s, rate: 1, burst: 1}
`, srv.URL))
	m := providers.Message{ID: "t1", Recipient: "+15550002222", Data: []byte(`{"body":"Hello"}`)}
	for name, want := range map[string]string{"hook": "hook-1", "sms": "SM1", "hook_untrusting": "", "sms_untrusting": ""} {
		p, err := newSender(name, cfg.Providers[name], io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		id, err := p.Send(context.Background(), m)
		var se *providers.SendError
		switch {
		case want != "" && (err != nil || id != want):
			t.Errorf("%s: %q, %v; want sent as %q", name, id, err, want)
		case want == "" && (!errors.As(err, &se) || se.Outcome != providers.Broken):
			t.Errorf("%s: %q, %v; want broken: its certificate is not trusted", name, id, err)
		}
	}
}

// TestTwilioAsksForItsStatuses: a twilio provider whose feedback is read
// asks Twilio to POST each message's statuses to the API's public URL,
// with the message's ID; one without asks for none.
func TestTwilioAsksForItsStatuses(t *testing.T) {
	asked := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		asked <- r.PostForm.Get("StatusCallback")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"sid":"SM1"}`))
	}))
	defer srv.Close()
	cfg := loadYAML(t, t.TempDir(), fmt.Sprintf(`providers:
  sms: {type: twilio, account_sid: AC1, password: token, from: "+15550001111", base_url: %[1]s, rate: 1, burst: 1,
        feedback: {public_url: "https://api.example.com/"}}
  quiet: {type: twilio, account_sid: AC1, password: token, from: "+15550001111", base_url: %[1]s, rate: 1, burst: 1}
`, srv.URL))
	for name, want := range map[string]string{"sms": "https://api.example.com/v1/feedback/sms?m=t1", "quiet": ""} {
		p, err := newSender(name, cfg.Providers[name], io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Send(context.Background(), providers.Message{ID: "t1", Recipient: "+15550002222", Data: []byte(`{"body":"Hello"}`)}); err != nil {
			t.Fatal(err)
		}
		if got := <-asked; got != want {
			t.Errorf("%s asked for its statuses at %q, want %q", name, got, want)
		}
	}
}

// loadYAML writes yaml as dir's config.yaml and loads it.
func loadYAML(t *testing.T, dir, yaml string) *config.Config {
	t.Helper()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
