package throttle

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// Every Redis key the engine writes is built in this file. A key is
//
//	<prefix>{<subject>}:<kind>:<rule>
//
// The subject (a recipient, a provider) is the Redis Cluster hash tag, so all
// the rules of one subject share a slot and are admitted by one script call.
// Rule names are restricted at construction; subjects are arbitrary user data
// and are encoded by encodeSubject so that none can reach another's keys or
// break the hash tag.

// DefaultPrefix starts every key unless Options.Prefix says otherwise.
const DefaultPrefix = "throttle:"

// maxEncoded is the longest encoded subject kept readable; longer ones are hashed.
const maxEncoded = 128

// keepByte reports whether a subject byte is kept as is.
func keepByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '@' || c == '+'
}

// encodeSubject maps any subject to a string of [A-Za-z0-9-_.@+%#] with no
// braces or colons, one-to-one up to SHA-256 collisions: bytes outside the
// kept set are written %XX (so '%' itself is escaped), and an encoding longer
// than maxEncoded is replaced by '#' and the base64url SHA-256 of the subject
// ('#' never appears in the escaped form, so the two forms cannot meet).
func encodeSubject(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if keepByte(s[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > maxEncoded {
		sum := sha256.Sum256([]byte(s))
		return "#" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	if n == len(s) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keepByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// subjectTag returns "<prefix>{<encoded subject>}", the start of every key of
// that subject.
func subjectTag(prefix, subject string) string {
	return prefix + "{" + encodeSubject(subject) + "}"
}

func quotaKey(tag, rule string) string    { return tag + ":q:" + rule }
func bucketKey(tag, rule string) string   { return tag + ":b:" + rule }
func ledgerKey(tag, rule string) string   { return tag + ":b:" + rule + ":held" }
func bookKey(tag, rule string) string     { return tag + ":b:" + rule + ":book" }
func slotsKey(tag, rule string) string    { return tag + ":b:" + rule + ":slots" }
func fairKey(tag, rule string) string     { return tag + ":b:" + rule + ":fair" }
func tenantsKey(tag, rule string) string  { return tag + ":b:" + rule + ":tenants" }
func placesKey(tag, rule string) string   { return tag + ":b:" + rule + ":places" }
func fixedKey(tag, rule string) string    { return tag + ":f:" + rule }
func calendarKey(tag, rule string) string { return tag + ":c:" + rule }

// checkPrefix rejects prefixes that would take over the hash tag.
func checkPrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return fmt.Errorf("throttle: key prefix %q: must not contain '{' or '}'", p)
	}
	return nil
}
