package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/message"
)

// FuzzParseLine checks the JSONL line parser and the checks after it: they
// never panic, a rejection is one line of text, and a line they accept
// becomes a task whose payload message.Decode reads back as that line says,
// with the config's defaults filled in.
func FuzzParseLine(f *testing.F) {
	seeds, err := filepath.Glob("testdata/*/*.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range append(seeds, "testdata/mixed.jsonl") {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			f.Add(bytes.TrimSuffix(line, []byte("\r")))
		}
	}
	f.Add([]byte(`{"recipient":"a\u0000b","template":"t\ud800","data":{"x":"<&>","y":[1e400]}}`))
	f.Add([]byte(`{"recipient":"a","template":"t","send_by":"2099-02-29T25:00:00Z"}`))
	f.Add([]byte(`{"recipient":"a","template":"t","send_by":"2099-01-01T00:00:00.123456789+14:00","idempotency_key":""}`))
	cfg, err := config.LoadWithEnv(testConfig, func(string) string { return "" })
	if err != nil {
		f.Fatal(err)
	}
	c := intake.Checker{Config: cfg, Name: "config.yaml"}
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := intake.ParseLine(line)
		if err == nil {
			var j intake.Job
			if j, err = c.Check(e, now); err == nil {
				checkRoundTrip(t, c, e, j)
				return
			}
		}
		if msg := err.Error(); msg == "" || strings.ContainsAny(msg, "\n\r") {
			t.Errorf("rejection %q is not one line of text", msg)
		}
	})
}

// checkRoundTrip checks that j's task is e as the worker will read it.
func checkRoundTrip(t *testing.T, c intake.Checker, e intake.Entry, j intake.Job) {
	t.Helper()
	payload := j.Task.Payload()
	n, err := message.Decode(payload)
	if err != nil {
		t.Fatalf("accepted %+v, but its payload %s does not decode: %v", e, payload, err)
	}
	want := message.Notification{
		Recipient: e.Recipient,
		Policy:    cmp.Or(e.Policy, c.Config.Defaults.Policy),
		Provider:  cmp.Or(e.Provider, c.Config.Defaults.Provider),
		Template:  e.Template,
		TZ:        e.TZ,
		Tenant:    e.Tenant,
	}
	got := n
	if got.Queued == nil {
		t.Errorf("payload %s: no queued_at", payload)
	}
	got.Data, got.SendBy, got.Queued = nil, nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("payload %s:\n got %+v\nwant %+v", payload, got, want)
	}
	if !sameJSON(n.Data, e.Data) {
		t.Errorf("payload data %s, want %s", n.Data, e.Data)
	}
	if (n.SendBy == nil) != (e.SendBy == nil) || n.SendBy != nil && !n.SendBy.Equal(*e.SendBy) {
		t.Errorf("payload send_by %v, want %v", n.SendBy, e.SendBy)
	}
	if q := cmp.Or(e.Queue, c.Config.Defaults.Queue); j.Queue != q {
		t.Errorf("queue %q, want %q", j.Queue, q)
	}
	if e.IdempotencyKey != "" && j.ID != message.TaskID(e.IdempotencyKey) {
		t.Errorf("task ID %s, want the one of key %q", j.ID, e.IdempotencyKey)
	}
}

// sameJSON reports whether a and b hold the same JSON value, or are both empty.
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	va, erra := decodeJSON(a)
	vb, errb := decodeJSON(b)
	return erra == nil && errb == nil && reflect.DeepEqual(va, vb)
}

// decodeJSON decodes data keeping numbers as written (1e400 is no float64).
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}
