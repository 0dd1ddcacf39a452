package message

import (
	"errors"
	"testing"
)

// TestControlCharactersRefused: a template or task ID with a control
// character, or a recipient of spaces only, is refused by Decode and
// NewTask alike, as the recipient's control characters always were: a Go
// producer cannot enqueue what the API and enqueue refuse.
func TestControlCharactersRefused(t *testing.T) {
	cases := []struct {
		name    string
		n       Notification
		id      string
		payload string
		want    string
	}{
		{"NUL in the template", Notification{Recipient: "a", Policy: "p", Provider: "x", Template: "t\x00"}, "id",
			`{"recipient":"a","policy":"p","provider":"x","template":"t\u0000"}`, "template: control character U+0000 (byte 2): bad notification"},
		{"ESC in the template", Notification{Recipient: "a", Policy: "p", Provider: "x", Template: "\x1b[31mred"}, "id",
			`{"recipient":"a","policy":"p","provider":"x","template":"\u001b[31mred"}`, "template: control character U+001B (byte 1): bad notification"},
		{"a recipient of spaces", Notification{Recipient: "   ", Policy: "p", Provider: "x", Template: "t"}, "id",
			`{"recipient":"   ","policy":"p","provider":"x","template":"t"}`, "recipient: blank (only spaces): bad notification"},
		{"ESC in the task ID", Notification{Recipient: "a", Policy: "p", Provider: "x", Template: "t"}, "key\x1b",
			"", "task ID: control character U+001B (byte 4): bad notification"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := NewTask(c.n, c.id); err == nil || err.Error() != c.want || !errors.Is(err, ErrBadPayload) {
				t.Errorf("NewTask: %v, want %s", err, c.want)
			}
			if c.payload == "" {
				return
			}
			if _, err := Decode([]byte(c.payload)); err == nil || err.Error() != c.want {
				t.Errorf("Decode: %v, want %s", err, c.want)
			}
		})
	}
}
