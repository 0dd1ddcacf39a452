package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/textdist"
	"github.com/notify-throttle/throttler/jobs"
)

// entry is one notification as a JSONL line or the flags give it, before
// the config's defaults apply. An empty string is a field left out.
type entry struct {
	Recipient, Template     string
	Policy, Provider, Queue string
	Data                    json.RawMessage // a JSON object, or nil
	IdempotencyKey          string
	SendBy                  *time.Time
	TZ                      string // the recipient's IANA time zone
	Tenant                  string // the sender sharing the provider fairly; "": the default tenant
}

// Fields of a JSONL line.
var lineFields = []string{"recipient", "template", "policy", "provider", "queue", "data", "idempotency_key", "send_by", "tz", "tenant"}

// parseLine parses one JSONL line: a JSON object with the fields in
// lineFields, each at most once. null is the same as leaving a field out.
// The error says what is wrong in one line, naming the field.
func parseLine(line []byte) (entry, error) {
	var e entry
	if !utf8.Valid(line) {
		return e, fmt.Errorf("not UTF-8 (byte %d)", invalidUTF8(line)+1)
	}
	if !json.Valid(line) {
		return e, syntaxError(line)
	}
	if kind := jsonKind(line); kind != "object" {
		return e, fmt.Errorf("must be a JSON object (got %s)", kind)
	}
	seen := map[string]bool{}
	err := jobs.Members(line, func(name, raw []byte) error {
		key := string(name)
		if seen[key] {
			return fmt.Errorf("%s: given twice", key) // a known field: unknown ones fail at once
		}
		seen[key] = true
		return e.set(key, raw)
	})
	return e, err
}

// set sets the field key of e from its JSON value.
func (e *entry) set(key string, raw json.RawMessage) error {
	kind := jsonKind(raw)
	if kind == "null" {
		if !isField(key) {
			return unknownField(key)
		}
		return nil
	}
	str := func(dst *string) error {
		if kind != "string" {
			return fmt.Errorf("%s: must be a string (got %s)", key, kind)
		}
		return json.Unmarshal(raw, dst)
	}
	switch key {
	case "recipient":
		return str(&e.Recipient)
	case "template":
		return str(&e.Template)
	case "policy":
		return str(&e.Policy)
	case "provider":
		return str(&e.Provider)
	case "queue":
		return str(&e.Queue)
	case "idempotency_key":
		return str(&e.IdempotencyKey)
	case "tz":
		return str(&e.TZ)
	case "tenant":
		return str(&e.Tenant)
	case "data":
		if kind != "object" {
			return fmt.Errorf("data: must be a JSON object (got %s)", kind)
		}
		e.Data = raw
		return nil
	case "send_by":
		var s string
		if err := str(&s); err != nil {
			return err
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return fmt.Errorf("send_by: must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got %s)", quote(s))
		}
		e.SendBy = &t
		return nil
	}
	return unknownField(key)
}

func isField(key string) bool {
	for _, f := range lineFields {
		if f == key {
			return true
		}
	}
	return false
}

// unknownField says key is not a field, suggesting the one it may be a typo of.
func unknownField(key string) error {
	best, dist := "", 3
	for _, f := range lineFields {
		if d := textdist.Distance(strings.ToLower(key), f); d < dist {
			best, dist = f, d
		}
	}
	if best != "" && len(key) > dist+1 {
		return fmt.Errorf("unknown field %s (did you mean %s?)", quote(key), best)
	}
	return fmt.Errorf("unknown field %s (fields: %s)", quote(key), strings.Join(lineFields, ", "))
}

// syntaxError describes why line is not one JSON value.
func syntaxError(line []byte) error {
	err := json.Unmarshal(line, new(json.RawMessage))
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se) && strings.HasPrefix(se.Error(), "unexpected end"):
		return errors.New("not JSON: the line ends inside a value")
	case errors.As(err, &se) && se.Offset > 0:
		// Offset counts the bytes read up to and with the bad one.
		return fmt.Errorf("not JSON: %s (column %d)", se.Error(), se.Offset)
	case err != nil:
		return fmt.Errorf("not JSON: %v", err)
	}
	return errors.New("not JSON") // unreachable: line is valid JSON
}

// jsonKind names the kind of the JSON value that data starts with.
func jsonKind(data []byte) string {
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

// quote quotes s for a message on one line, shortened to maxQuoted bytes.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// job is a checked notification, ready to enqueue.
type job struct {
	id    string // the task ID
	queue string
	task  *asynq.Task
	keyed bool // the ID comes from an idempotency key: enqueueing it again is a duplicate
}

// checker checks entries against a config and makes them jobs.
type checker struct {
	cfg  *config.Config
	name string // the config file, as messages name it
}

// check applies the config's defaults to e, checks the result as the
// worker will and returns its job. The error says what is wrong in one line.
// A deadline before now is an error: the worker would only expire it.
func (c checker) check(e entry, now time.Time) (job, error) {
	r := c.cfg.Route(config.Route{Policy: e.Policy, Provider: e.Provider, Queue: e.Queue})
	n := jobs.Notification{
		Recipient: e.Recipient,
		Policy:    r.Policy,
		Provider:  r.Provider,
		Template:  e.Template,
		Data:      e.Data,
		SendBy:    e.SendBy,
		TZ:        e.TZ,
		Tenant:    e.Tenant,
	}
	queue := r.Queue
	if err := n.Check(); err != nil {
		return job{}, reason(err)
	}
	if _, ok := c.cfg.Policies[n.Policy]; !ok {
		return job{}, c.undefined("policy", n.Policy, suggestion(n.Policy, c.cfg.Policies))
	}
	if _, ok := c.cfg.Providers[n.Provider]; !ok {
		return job{}, c.undefined("provider", n.Provider, suggestion(n.Provider, c.cfg.Providers))
	}
	if _, ok := c.cfg.Worker.Queues[queue]; !ok {
		return job{}, c.undefined("queue", queue, suggestion(queue, c.cfg.Worker.Queues))
	}
	if n.SendBy != nil && !n.SendBy.After(now) {
		return job{}, fmt.Errorf("send_by: %s is in the past", n.SendBy.Format(time.RFC3339Nano))
	}
	id := jobs.TaskID(e.IdempotencyKey)
	opts := []asynq.Option{asynq.Queue(queue)}
	if e.IdempotencyKey != "" {
		// asynq forgets a completed task at once, and with it the ID's
		// conflict: keep keyed tasks so that the key dedupes after delivery.
		opts = append(opts, asynq.Retention(KeyRetention))
	}
	task, err := jobs.NewTask(n, id, opts...)
	if err != nil {
		return job{}, reason(err)
	}
	return job{id: id, queue: queue, task: task, keyed: e.IdempotencyKey != ""}, nil
}

// KeyRetention is how long a notification enqueued with an idempotency key
// is kept after it completed, so that enqueueing the same key again within
// it is a duplicate rather than a second message. The cost is the completed
// task's hash in Redis (about its payload's size) for that long.
const KeyRetention = 24 * time.Hour

func (c checker) undefined(kind, name, hint string) error {
	return fmt.Errorf("%s %s is not defined in %s%s", kind, quote(name), c.name, hint)
}

// reason is what is wrong with a notification, without the "bad
// notification" jobs wraps it with: the line says where it came from.
func reason(err error) error {
	var fe *jobs.FieldError
	if errors.As(err, &fe) {
		return fe
	}
	return err
}
