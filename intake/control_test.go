package intake

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

// testChecker checks against a config of policy marketing, provider
// console (a log provider) and queue default, the defaults.
func testChecker(t *testing.T) Checker {
	t.Helper()
	cfg := config.Default()
	cfg.Policies["marketing"] = config.Policy{Windows: []throttle.Window{{Limit: 1, Per: time.Hour}}, OverCap: config.OverCapDefer}
	cfg.Providers["console"] = config.Provider{Type: config.ProviderLog, Rate: 10, Burst: 10, Output: os.DevNull}
	cfg.Defaults = config.Defaults{Policy: "marketing", Provider: "console", Queue: "default"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return Checker{Config: cfg, Name: "config.yaml"}
}

// TestControlCharactersRefused: NUL, ESC and the other control characters
// are refused in the template and the idempotency key, as in the
// recipient, and a recipient or key of spaces only is refused too, each
// naming its field, whether the notification came as a JSONL line (the API,
// enqueue -file) or as an Entry (enqueue's flags).
func TestControlCharactersRefused(t *testing.T) {
	cases := []struct {
		name, line string
		entry      Entry
		field, msg string
	}{
		{"NUL in the template", `{"recipient":"a@example.com","template":"t\u0000"}`,
			Entry{Recipient: "a@example.com", Template: "t\x00"}, "template", "template: control character U+0000 (byte 2)"},
		{"ESC in the template", `{"recipient":"a@example.com","template":"\u001b[2J"}`,
			Entry{Recipient: "a@example.com", Template: "\x1b[2J"}, "template", "template: control character U+001B (byte 1)"},
		{"NUL in the key", `{"recipient":"a@example.com","template":"t","idempotency_key":"k\u0000"}`,
			Entry{Recipient: "a@example.com", Template: "t", IdempotencyKey: "k\x00"}, "idempotency_key", "idempotency_key: control character U+0000 (byte 2)"},
		{"DEL in the key", `{"recipient":"a@example.com","template":"t","idempotency_key":"k\u007f"}`,
			Entry{Recipient: "a@example.com", Template: "t", IdempotencyKey: "k\x7f"}, "idempotency_key", "idempotency_key: control character U+007F (byte 2)"},
		{"a key of spaces", `{"recipient":"a@example.com","template":"t","idempotency_key":"  "}`,
			Entry{Recipient: "a@example.com", Template: "t", IdempotencyKey: "  "}, "idempotency_key", "idempotency_key: blank (only spaces)"},
		{"a recipient of spaces", `{"recipient":"   ","template":"t"}`,
			Entry{Recipient: "   ", Template: "t"}, "recipient", "recipient: blank (only spaces)"},
	}
	c := testChecker(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				var e *Error
				if !errors.As(err, &e) || e.Field != tc.field || err.Error() != tc.msg {
					t.Errorf("%s: %v (%#v), want field %s and %q", how, err, e, tc.field, tc.msg)
				}
			}
			e, err := ParseLine([]byte(tc.line))
			if err == nil {
				_, err = c.Check(e, time.Now())
			}
			check("the line", err)
			_, err = c.Check(tc.entry, time.Now())
			check("the entry", err)
		})
	}
}
