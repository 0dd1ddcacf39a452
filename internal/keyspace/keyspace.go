// Package keyspace is the throttle engine's layout in Redis: the name of
// every key the engine writes and what each holds. The engine (throttle,
// whose Lua in lua/ writes the values) and the dashboard's read-only views
// (package dashboard) both name keys here, so the two cannot drift apart.
//
// A key is
//
//	<prefix>{<subject>}:<kind>:<rule>
//
// The subject (a recipient, a provider) is the Redis Cluster hash tag, so all
// the rules of one subject share a slot and are admitted by one script call.
// Rule names are restricted by the engine at construction; subjects are
// arbitrary user data and are encoded by EncodeSubject so that none can
// reach another's keys or break the hash tag. Times are µs of Redis TIME.
//
//	Quota     :q:<rule>         sorted set: member a task ID (a take of cost
//	                            n adds ID, ID\x1f2, ..., ID\x1fn: TaskOf),
//	                            score its admission, or its booked moment
//	                            ahead of now; pruned past the longest window
//	Bucket    :b:<rule>         hash: PauseField, the end of a pause (a
//	                            provider's 429); r, the rate its calendar is
//	                            laid at (lua/repace.lua)
//	Slots     :b:<rule>:slots   the bucket's calendar: sorted set, member the
//	                            start of a busy span (0 for one that started
//	                            when it was written), score its end; marks
//	                            of the key's life, member '-' and a number,
//	                            score 0 (so no read from now sees one); and
//	                            the
//	                            ledger: member LedgerEntry(task) of a task
//	                            that took a slot, score minus the slot's
//	                            start, kept until the slot ends and the
//	                            engine's Options.Remember more
//	Sent      :b:<rule>:sent    hash: per SentBin-wide bin (field: µs /
//	                            SentBin), the tokens workers sent in it
//	                            (throttle/sends.go), the last SentBins kept
//	Book      :b:<rule>:book    the tickets: sorted set, member a booked task
//	                            (ID, then \x1e and the cost when not 1),
//	                            score its slot's start; kept unclaimed for
//	                            Grace after it
//	Fair      :b:<rule>:fair    hash: per waiting tenant (sender) of the
//	                            bucket "F,G,w,E" (last place, gate, weight,
//	                            end of its wait), and the line's totals
//	                            under "\0W", "\0J", "\0P" (lua/book.lua)
//	Tenants   :b:<rule>:tenants sorted set: member a tenant of Fair, score
//	                            the end of its wait, for its expiry
//	Calendar  :c:<rule>         sorted set: member a task ID (as Quota's),
//	                            score its moment; pruned before now's window
//
// One key is a task's, not a subject's: its done marker,
//
//	Done      <prefix>done:{<task ID>}  string: the moment the caller marked the
//	                            task done (Unix ms, its clock, for people),
//	                            expiring when the caller says
//
// whose hash tag is the task ID (on a cluster it lives in the task's slot);
// every other key has '{' right after the prefix, so none can meet it.
//
// A recipient's bookings are its quota entries ahead of now (a booked task's
// entries sit at its moment); a provider's are its tickets, and the slots
// ahead of now in its ledger, of tasks sleeping until their moment.
package keyspace

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// DefaultPrefix starts every key unless the engine is given another.
const DefaultPrefix = "throttle:"

// MaxEncoded is the longest encoded subject kept readable; longer ones are
// hashed.
const MaxEncoded = 128

// The values the Lua writes that readers must agree on, each a constant of
// the Lua too (TestConstantsMatchLua).
const (
	// Grace is how long after its moment a ticket nobody claimed is kept
	// (lua/book.lua GRACE): a task that wakes late still holds it.
	Grace = 10 * 60 * 1000000 // µs
	// SentBin is the width of the Bucket hash's bins of sends, SentBins
	// how many are kept (throttle/sends.go writes them).
	SentBin  = 10000000 // µs
	SentBins = 30
	// PauseField is the Bucket hash's field of a pause's end.
	PauseField = "p"
)

// keepByte reports whether a subject byte is kept as is.
func keepByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '@' || c == '+'
}

// EncodeSubject maps any subject to a string of [A-Za-z0-9-_.@+%#] with no
// braces or colons, one-to-one up to SHA-256 collisions: other bytes are
// written %XX ('%' too), and an encoding longer than MaxEncoded is '#' and
// the base64url SHA-256 of the subject ('#' never appears in the escaped
// form, so the two cannot meet).
func EncodeSubject(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if keepByte(s[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > MaxEncoded {
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

// Tag returns "<prefix>{<encoded subject>}", the start of every key of that
// subject: the key builders below take it.
func Tag(prefix, subject string) string {
	return prefix + "{" + EncodeSubject(subject) + "}"
}

// The keys of a subject's rules, from the subject's Tag; what each holds is
// in the package comment.

func Quota(tag, rule string) string    { return tag + ":q:" + rule }
func Bucket(tag, rule string) string   { return tag + ":b:" + rule }
func Sent(tag, rule string) string     { return tag + ":b:" + rule + ":sent" }
func Book(tag, rule string) string     { return tag + ":b:" + rule + ":book" }
func Slots(tag, rule string) string    { return tag + ":b:" + rule + ":slots" }
func Fair(tag, rule string) string     { return tag + ":b:" + rule + ":fair" }
func Tenants(tag, rule string) string  { return tag + ":b:" + rule + ":tenants" }
func Calendar(tag, rule string) string { return tag + ":c:" + rule }

// LedgerEntry is the member of task's entry in a bucket's ledger, which
// lives in the bucket's Slots (lua/rules.lua: LEDGER).
func LedgerEntry(task string) string { return "#" + task }

// Done is task id's done marker (see the package comment).
func Done(prefix, id string) string { return prefix + "done:{" + id + "}" }

// TaskOf returns the task ID of a Quota or Calendar member (a take of cost n
// holds ID, ID\x1f2, ..., ID\x1fn) or of a ticket in Book (ID, then \x1e and
// the cost).
func TaskOf(member string) string {
	id, _, _ := strings.Cut(member, "\x1f")
	id, _, _ = strings.Cut(id, "\x1e")
	return id
}

// CheckPrefix rejects a key prefix that would take over the hash tag.
func CheckPrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return fmt.Errorf("key prefix %q: must not contain '{' or '}'", p)
	}
	return nil
}
