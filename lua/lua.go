// Package lua holds the project's Redis Lua code. rules.lua holds the rule
// kinds and book.lua booking's steps; the seven entry points are admit and
// book (admit.lua), release and forget (release.lua), pause (pause.lua),
// repace and reweigh (repace.lua), listed in rules.lua's header. Together
// they make one library, which runs two ways:
//
//   - as a Redis Function library (Redis >= 7): loaded once per server with
//     FUNCTION LOAD and called with FCALL, so the library's local functions
//     are built once rather than on every call;
//   - as seven scripts for EVAL/EVALSHA, for servers without FUNCTION (older
//     Redis, miniredis): the library with a last line that calls one entry
//     point on KEYS and ARGV.
//
// Both run the same code on the same arguments.
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

//go:embed rules.lua
var rules string

//go:embed book.lua
var book string

//go:embed admit.lua
var admit string

//go:embed release.lua
var release string

//go:embed pause.lua
var pause string

//go:embed repace.lua
var repace string

// body is the library's code, without a header or registrations.
var body = rules + book + admit + release + repace + pause

// version names this code: the first 12 hex digits of its SHA-1.
var version = func() string {
	sum := sha1.Sum([]byte(body))
	return hex.EncodeToString(sum[:6])
}()

// Library is the function library, and the names its entry points are
// registered under. The names carry the code's version, so workers of
// different versions sharing a server each call their own code; a new
// version is a new library, loaded next to the old one.
type Library struct {
	Name    string // library name, for FUNCTION LOAD / FUNCTION DELETE
	Source  string // for FUNCTION LOAD
	Admit   string // function names for FCALL
	Release string
	Pause   string
	Forget  string
	Book    string
	Repace  string
	Reweigh string
}

// Functions returns the library for FUNCTION LOAD.
func Functions() Library {
	l := Library{
		Name:    "throttle_" + version,
		Admit:   "throttle_admit_" + version,
		Release: "throttle_release_" + version,
		Pause:   "throttle_pause_" + version,
		Forget:  "throttle_forget_" + version,
		Book:    "throttle_book_" + version,
		Repace:  "throttle_repace_" + version,
		Reweigh: "throttle_reweigh_" + version,
	}
	l.Source = "#!lua name=" + l.Name + "\n" + body +
		crossSlot(l.Admit, "admit") +
		crossSlot(l.Release, "release") +
		"redis.register_function('" + l.Pause + "', pause)\n" +
		crossSlot(l.Forget, "forget") +
		crossSlot(l.Book, "book") +
		"redis.register_function('" + l.Repace + "', repace)\n" +
		"redis.register_function('" + l.Reweigh + "', reweigh)\n"
	return l
}

// crossSlot registers the function fn may read keys of other slots its
// master serves, beyond the ones declared (rules.lua, task_keys). A script
// run by EVAL, without a shebang, may already.
func crossSlot(name, fn string) string {
	return "redis.register_function{function_name='" + name + "', callback=" + fn + ", flags={'allow-cross-slot-keys'}}\n"
}

// Admit returns the admission script for EVAL (see admit.lua).
func Admit() string { return script("admit") }

// Release returns the release script for EVAL (see release.lua).
func Release() string { return script("release") }

// Forget returns the script that drops bucket holdings without a refund
// (see release.lua).
func Forget() string { return script("forget") }

// Book returns the booking script for EVAL (see admit.lua).
func Book() string { return script("book") }

// Pause returns the bucket pause script for EVAL (see pause.lua).
func Pause() string { return script("pause") }

// Repace returns the script that moves a bucket's waiting work to a changed
// rate, for EVAL (see repace.lua).
func Repace() string { return script("repace") }

// script is the library run as a script that calls entry point on KEYS and
// ARGV. It marks itself scripted: it may run on a server older than Redis 7.
func script(entry string) string {
	return body + "scripted = true\nreturn " + entry + "(KEYS, ARGV)\n"
}

// Reweigh returns the script that moves a bucket's tenants' lines to
// changed weights, for EVAL (see repace.lua).
func Reweigh() string { return script("reweigh") }
