package message

import (
	"testing"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"alice@example.com": "a***@example.com",
		"é@x.org":           "é***@x.org",
		"+15551234567":      "+1***67",
		"12345":             "***",
		"@handle":           "@h***le",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
