package message

import (
	"strings"
	"unicode/utf8"
)

// Redact hides most of a recipient for logs and dashboards while keeping
// enough to tell recipients apart at a glance: an address keeps its first
// character and its domain (a***@example.com), anything else its first two
// and last two characters (+1***67); up to five characters are hidden
// whole.
func Redact(recipient string) string {
	if at := strings.LastIndexByte(recipient, '@'); at > 0 {
		first, _ := utf8.DecodeRuneInString(recipient)
		return string(first) + "***" + recipient[at:]
	}
	r := []rune(recipient)
	if len(r) <= 5 {
		return "***"
	}
	return string(r[:2]) + "***" + string(r[len(r)-2:])
}
