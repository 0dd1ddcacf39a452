package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/notify-throttle/throttler/internal/redisconn"
)

const (
	maxErrors = 20 // problems one error lists; a last line counts the rest
	maxShown  = 80 // bytes of a bad value a message quotes
)

// Error is one problem with a configuration, as "file:line: path: message":
//
//	config.yaml:12: policies.marketing[1].per: must be > 0 (got 0s)
//
// Load, Parse and Validate return an *Error for one problem, and the
// errors.Join of them (one per line, in file order) for several.
type Error struct {
	File string // the name given to Load or Parse; "" for a Config built in code
	Line int    // the bad value's line, or that of the key whose value is missing; 0: unknown
	Path string // the setting ("providers.sms.url") or the variable that set it (REDIS_URL); "": the file
	Msg  string // what is wrong, quoting the bad value
	Err  error  // the cause another package reported (throttle.ErrInvalidRule), for errors.Is
}

// Error formats e, the one place problems are put into words.
func (e *Error) Error() string {
	s := oneLine(e.Msg)
	if e.Path != "" {
		s = oneLine(e.Path) + ": " + s
	}
	switch {
	case e.File != "" && e.Line > 0:
		s = e.File + ":" + strconv.Itoa(e.Line) + ": " + s
	case e.File != "":
		s = e.File + ": " + s
	}
	return s
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// oneLine escapes the invisible characters another package's message may
// echo, so that each problem stays on one line.
func oneLine(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) }) < 0 {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// errorList collects the problems found in one pass over a configuration.
type errorList []*Error

// err returns nil, the one error, or the first maxErrors in line order
// joined, with a last line counting the rest.
func (l errorList) err() error {
	if len(l) == 1 {
		return l[0]
	}
	slices.SortStableFunc(l, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	var out []error
	for i, e := range l {
		if i == maxErrors {
			out = append(out, &Error{File: e.File, Line: e.Line, Msg: fmt.Sprintf("and %d more problems", len(l)-i)})
			break
		}
		out = append(out, e)
	}
	return errors.Join(out...) // nil when l is empty
}

// quote quotes s for a message, shortened to maxShown bytes.
func quote(s string) string { return redisconn.Quote(s) }

// source is where a parsed Config's values came from, indexed by path in
// the decoder's one walk, so that errors found later still name the line.
type source struct {
	file   string
	lines  map[string]int    // the line of every value (and list item)
	failed map[string]bool   // paths with a problem reported, so that one is reported once
	env    map[string]string // paths set from the environment, with the variable
	refs   map[string]string // paths set by a secret reference, as written: "{env: SMS_AUTH}"
	// unresolved are the secrets a producer left unresolved (LoadProducer),
	// their values empty; unresolvedPrefixes and resolvedInside say where.
	unresolved                         map[string]bool
	unresolvedPrefixes, resolvedInside []string
}

func newSource(file string) *source {
	return &source{file: file, lines: map[string]int{}, failed: map[string]bool{}, env: map[string]string{}, refs: map[string]string{}, unresolved: map[string]bool{}}
}

// has reports whether the file sets path.
func (s *source) has(path string) bool { return s != nil && s.lines[path] > 0 }

// isUnresolved reports whether path is a secret a producer left unresolved.
func (s *source) isUnresolved(path string) bool { return s != nil && s.unresolved[path] }

// unresolvedUnder reports whether the secrets and files at path are left
// unresolved and unread (see LoadProducer).
func (s *source) unresolvedUnder(path string) bool {
	return s != nil && slices.ContainsFunc(s.unresolvedPrefixes, func(p string) bool { return strings.HasPrefix(path, p) }) &&
		!slices.ContainsFunc(s.resolvedInside, func(p string) bool { return strings.Contains(path+".", p) })
}

// parent returns path without its last element: "a.b[1]" -> "a.b" -> "a" -> "".
func parent(path string) string {
	if i := strings.LastIndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return ""
}

// failedAt reports whether a problem was reported at path or above it.
func (s *source) failedAt(path string) bool {
	for p := path; s != nil && p != ""; p = parent(p) {
		if s.failed[p] {
			return true
		}
	}
	return false
}

// errorAt returns an error about path, on the line of the first of path and
// alts the file sets, else of the nearest setting containing path.
func (s *source) errorAt(path, msg string, alts ...string) *Error {
	if s == nil {
		return &Error{Path: path, Msg: msg}
	}
	if v, ok := s.env[path]; ok {
		return &Error{Path: v, Msg: msg}
	}
	line := 0
	for _, p := range append([]string{path}, alts...) {
		line = cmp.Or(line, s.lines[p])
	}
	for p := path; line == 0 && p != ""; p = parent(p) {
		line = s.lines[p]
	}
	return &Error{File: s.file, Line: cmp.Or(line, s.lines[""], 1), Path: path, Msg: msg}
}

// shown quotes the value u of the setting at path for a message: its
// password redacted, or the secret reference that set it.
func (s *source) shown(path, u string) string {
	if s != nil && s.refs[path] != "" {
		return "the value of " + s.refs[path]
	}
	return quote(redisconn.RedactURL(u))
}
