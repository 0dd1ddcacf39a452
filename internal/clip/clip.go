// Package clip shortens text for messages, logs and events without
// splitting a UTF-8 sequence.
package clip

import "unicode/utf8"

// Cut returns s when it is at most n bytes long, else its first n bytes or
// fewer, cut at the start of a rune, followed by mark.
func Cut(s string, n int, mark string) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + mark
}
