// Package keyspacetest holds test inputs for code that builds keys with
// keyspace: the encoder's own tests and the engine's end-to-end ones share
// them.
package keyspacetest

import (
	"strings"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// NastySubjects are subjects (and, where valid, task IDs) that try to break
// a key: hash-tag braces, the key separator, blanks, control bytes, unicode,
// escapes that look like other subjects, the hashed form's marker, and
// lengths on both sides of the hashing threshold.
func NastySubjects() []string {
	const most = keyspace.MaxEncoded
	return []string{
		"{", "}", ":", " ", "\n", "\t", "\x00", "\x7f", "\xff",
		"{}", "}{", "a{b}c", "a}b{c", "{alice}", "alice:q:mkt", "x}:q:{y",
		"héllo wörld", "日本語", "🙂", "e\u0301", "\u00e9",
		"%41", "A", "%2541", "%", "%%", "%4", "#", "#abc", "#" + strings.Repeat("A", 43),
		"alice@example.com", "+33 6 12 34 56 78", "-", "_", ".", "..",
		strings.Repeat("x", 1024),
		strings.Repeat("a", most),     // longest readable
		strings.Repeat("a", most+1),   // hashed
		strings.Repeat("{", most/3),   // 126 escaped bytes: readable
		strings.Repeat("{", most/3+1), // 129: hashed
	}
}
