// Package intake reads notifications as producers hand them in (a line of
// enqueue -file, an API request's body, enqueue's flags), decodes them
// strictly (ParseLine), checks them against the config with its defaults
// applied and makes them asynq tasks (Checker), so that every way in
// accepts and refuses alike, with the same messages
// (docs/design.md#enqueueing-notifications).
package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/notify-throttle/throttler/internal/clip"
	"github.com/notify-throttle/throttler/internal/textdist"
	"github.com/notify-throttle/throttler/message"
)

// Error is what is wrong with a notification: Field names the field at
// fault (one of Fields, or another name for an unknown field), or is "" for
// the object as a whole. Its text is "<Field>: <Msg>", or Msg alone where
// the message names the field itself (an unknown field) or there is none.
type Error struct {
	Field string
	Msg   string
	// TooLarge says the notification is valid but its task would be over
	// message.MaxPayloadLen: the API answers 413 rather than 400.
	TooLarge bool
	bare     bool // Msg names the field: the text is Msg alone
}

func (e *Error) Error() string {
	if e.Field == "" || e.bare {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// fieldErr returns an *Error about field.
func fieldErr(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// wholeErr returns an *Error about the object as a whole.
func wholeErr(format string, args ...any) error {
	return &Error{Msg: fmt.Sprintf(format, args...)}
}

// Entry is one notification as a producer gives it (a JSONL line, enqueue's
// flags, an API request), before the config's defaults apply. An empty
// string is a field left out.
type Entry struct {
	Recipient, Template     string
	Policy, Provider, Queue string
	Data                    json.RawMessage // a JSON object, or nil
	IdempotencyKey          string
	SendBy                  *time.Time
	// SendAt or SendAtLocal, one or neither, schedule it: an instant, or
	// a time of day ("09:00") in the recipient's zone (TZ, else its
	// policy's), its next occurrence (see NextLocal).
	SendAt      *time.Time
	SendAtLocal string
	TZ          string // the recipient's IANA time zone
	Tenant      string // the sender sharing the provider fairly; "": the default tenant
}

// Fields are the fields of a notification's JSON object.
var Fields = []string{"recipient", "template", "policy", "provider", "queue", "data", "idempotency_key", "send_by", "send_at", "send_at_local", "tz", "tenant"}

// ParseLine parses one notification: a JSON object with the fields in
// Fields, each at most once. null is the same as leaving a field out.
// The error, an *Error, says what is wrong in one line, naming the field.
func ParseLine(line []byte) (Entry, error) {
	var e Entry
	if !utf8.Valid(line) {
		return e, wholeErr("not UTF-8 (byte %d)", invalidUTF8(line)+1)
	}
	if !json.Valid(line) {
		return e, syntaxError(line)
	}
	if kind := JSONKind(line); kind != "object" {
		return e, wholeErr("must be a JSON object (got %s)", kind)
	}
	seen := map[string]bool{}
	err := message.Members(line, func(name, raw []byte) error {
		key := string(name)
		if seen[key] {
			return fieldErr(key, "given twice") // a known field: unknown ones fail at once
		}
		seen[key] = true
		return e.set(key, raw)
	})
	return e, reason(err)
}

// set sets the field key of e from its JSON value.
func (e *Entry) set(key string, raw json.RawMessage) error {
	strs := map[string]*string{"recipient": &e.Recipient, "template": &e.Template, "policy": &e.Policy, "provider": &e.Provider,
		"queue": &e.Queue, "idempotency_key": &e.IdempotencyKey, "tz": &e.TZ, "tenant": &e.Tenant,
		"send_at_local": &e.SendAtLocal} // read with its zone (Checker.Check)
	times := map[string]**time.Time{"send_by": &e.SendBy, "send_at": &e.SendAt}
	switch kind := JSONKind(raw); {
	case !slices.Contains(Fields, key):
		return unknownField(key)
	case kind == "null":
		return nil
	case key == "data" && kind != "object":
		return fieldErr("data", "must be a JSON object (got %s)", kind)
	case key == "data":
		e.Data = raw
		return nil
	case kind != "string":
		return fieldErr(key, "must be a string (got %s)", kind)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return fieldErr(key, "%v", err)
	}
	if dst, ok := times[key]; ok {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return fieldErr(key, "must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got %s)", Quote(s))
		}
		*dst = &t
		return nil
	}
	*strs[key] = s
	if key == "idempotency_key" {
		return CheckKey(s, key)
	}
	return nil
}

// CheckKey reports what is wrong with an idempotency key given as field: a
// control character, which would pass for something else in messages and
// logs, or nothing but spaces, a mistake. "" is no key.
func CheckKey(key, field string) error {
	for i, r := range key {
		if unicode.IsControl(r) {
			return fieldErr(field, "control character %U (byte %d)", r, i+1)
		}
	}
	if key != "" && strings.TrimSpace(key) == "" {
		return fieldErr(field, "blank (only spaces)")
	}
	return nil
}

// unknownField says key is not a field, suggesting the one it may be a typo of.
func unknownField(key string) error {
	best, dist := "", 3
	for _, f := range Fields {
		if d := textdist.Distance(strings.ToLower(key), f); d < dist {
			best, dist = f, d
		}
	}
	if best != "" && len(key) > dist+1 {
		return &Error{Field: key, Msg: fmt.Sprintf("unknown field %s (did you mean %s?)", Quote(key), best), bare: true}
	}
	return &Error{Field: key, Msg: fmt.Sprintf("unknown field %s (fields: %s)", Quote(key), strings.Join(Fields, ", ")), bare: true}
}

// syntaxError describes why line (not valid JSON) is not one JSON value.
func syntaxError(line []byte) error {
	err := json.Unmarshal(line, new(json.RawMessage))
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se) && strings.HasPrefix(se.Error(), "unexpected end"):
		return wholeErr("not JSON: the line ends inside a value")
	case errors.As(err, &se) && se.Offset > 0:
		// Offset counts the bytes read up to and with the bad one.
		return wholeErr("not JSON: %s (column %d)", se.Error(), se.Offset)
	}
	return wholeErr("not JSON: %v", err)
}

// JSONKind names the kind of the JSON value that data starts with.
func JSONKind(data []byte) string {
	data = bytes.TrimLeft(data, " \t\r\n")
	if len(data) == 0 {
		return "nothing"
	}
	switch data[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// invalidUTF8 returns the index of the first byte of s that is not UTF-8.
func invalidUTF8(s []byte) int {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(s)
}

// maxQuoted is how many bytes of a bad value a message shows.
const maxQuoted = 64

// Quote quotes s for a message on one line, shortened to maxQuoted bytes.
func Quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return strconv.Quote(clip.Cut(s, maxQuoted, "")) + "..."
}
