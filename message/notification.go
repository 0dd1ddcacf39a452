// Package message is the notification as producers and workers exchange
// it: the payload (Notification), its strict decoding, task IDs and the
// asynq task that carries it, and how a recipient shows in logs (Redact).
// The payload's fields are in docs/design.md (Enqueueing notifications).
package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/internal/clip"
	"github.com/notify-throttle/throttler/internal/timefmt"
)

// TaskType is the asynq task type of one notification.
const TaskType = "notify"

// Size limits keep one bad producer from filling Redis.
const (
	MaxRecipientLen = 256      // bytes
	MaxTemplateLen  = 128      // bytes
	MaxTenantLen    = 256      // bytes
	MaxPayloadLen   = 64 << 10 // bytes of the whole JSON payload
)

// ErrBadPayload is wrapped by every error about a malformed notification.
var ErrBadPayload = errors.New("bad notification")

// FieldError says what is wrong with a notification: Field names the field
// at fault ("recipient", "data", "task ID"), or is "" for the payload as a
// whole, and Problem says what is wrong. Decode, Check and NewTask return it
// wrapped with ErrBadPayload ("recipient: missing: bad notification"); a
// caller that says where the notification came from, as enqueue names the
// file and line, takes it out with errors.As and shows it alone.
type FieldError struct {
	Field, Problem string
}

// Error returns "<Field>: <Problem>", or the Problem alone.
func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Problem
	}
	return e.Field + ": " + e.Problem
}

// clipped is err's text cut to 300 bytes (at a rune): a JSON error may quote
// a value of the payload whole (a time that does not parse, say).
func clipped(err error) string { return clip.Cut(err.Error(), 300, "…") }

// bad returns a *FieldError wrapped with ErrBadPayload.
func bad(field, format string, args ...any) error {
	return fmt.Errorf("%w: %w", &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}, ErrBadPayload)
}

// Notification is one message to one recipient, the payload of a task.
type Notification struct {
	// Recipient is who receives it, and whose quota it counts against.
	Recipient string `json:"recipient"`
	// Policy names the recipient policy (quota windows) in the config.
	Policy string `json:"policy"`
	// Provider names the provider that delivers it, and whose bucket it takes.
	Provider string `json:"provider"`
	// Template names the message template; Data fills it.
	Template string          `json:"template"`
	Data     json.RawMessage `json:"data,omitempty"`
	// SendBy, when set, is the latest time it may be delivered; after that
	// it expires instead of arriving late.
	SendBy *time.Time `json:"send_by,omitempty"`
	// SendAt, when set, is its scheduled moment, a whole second not after
	// SendBy (docs/design.md, "Scheduled sends").
	SendAt *time.Time `json:"send_at,omitempty"`
	// TZ is the recipient's IANA time zone, for its policy's calendar
	// windows and quiet hours; "" is the policy's zone.
	TZ string `json:"tz,omitempty"`
	// Campaign names the campaign run that created it, if any.
	Campaign string `json:"campaign,omitempty"`
	// Tenant is the sender whose fair share of the provider it uses
	// (throttle.Booking.Tenant); "" is the default tenant.
	Tenant string `json:"tenant,omitempty"`
	// Queued is when NewTask made its task (the producer's clock), from
	// which a policy's max delay counts unless SendAt is later.
	Queued *time.Time `json:"queued_at,omitempty"`
}

// Check reports the first thing wrong with n, naming the field.
func (n *Notification) Check() error {
	field := func(name, v string, max int) error {
		switch {
		case v == "":
			return bad(name, "missing")
		case len(v) > max:
			return bad(name, "%d bytes, longer than %d", len(v), max)
		case !utf8.ValidString(v):
			return bad(name, "not UTF-8")
		}
		return nil
	}
	if err := field("recipient", n.Recipient, MaxRecipientLen); err != nil {
		return err
	}
	if err := noControl("recipient", n.Recipient); err != nil {
		return err
	}
	if strings.TrimSpace(n.Recipient) == "" {
		return bad("recipient", "blank (only spaces)")
	}
	if err := field("template", n.Template, MaxTemplateLen); err != nil {
		return err
	}
	if err := noControl("template", n.Template); err != nil {
		return err
	}
	if err := field("policy", n.Policy, MaxTemplateLen); err != nil {
		return err
	}
	if err := field("provider", n.Provider, MaxTemplateLen); err != nil {
		return err
	}
	if n.Tenant != "" {
		if err := field("tenant", n.Tenant, MaxTenantLen); err != nil {
			return err
		}
		if err := noControl("tenant", n.Tenant); err != nil {
			return err
		}
	}
	if len(n.Data) > 0 && !json.Valid(n.Data) {
		return bad("data", "not JSON")
	}
	if n.SendAt != nil && n.SendBy != nil && n.SendAt.After(*n.SendBy) {
		return bad("send_at", "%s is after send_by %s: it would only expire",
			n.SendAt.Format(time.RFC3339Nano), n.SendBy.Format(time.RFC3339Nano))
	}
	if n.TZ != "" {
		if _, err := LoadZone(n.TZ); err != nil {
			return err
		}
	}
	return nil
}

// noControl refuses a control character in field's value v: a recipient,
// template, tenant or task ID names keys in Redis or a provider's message
// and appears in log lines and the dashboard, where a NUL, an ESC or a
// newline would pass for something else.
func noControl(field, v string) error {
	for i, r := range v {
		if unicode.IsControl(r) {
			return bad(field, "control character %U (byte %d)", r, i+1)
		}
	}
	return nil
}

// CheckRecipient reports what is wrong with a recipient, as Check words it
// ("recipient: control character U+0000 (byte 2)"), for the views that
// take one outside a notification (the dashboard's lookups).
func CheckRecipient(recipient string) error {
	n := Notification{Recipient: recipient, Template: "-", Policy: "-", Provider: "-"}
	return n.Check()
}

// Decode parses and checks a task payload strictly: unknown fields, a
// payload over MaxPayloadLen or trailing data are errors.
func Decode(payload []byte) (Notification, error) {
	var n Notification
	if len(payload) > MaxPayloadLen {
		return n, bad("", "payload of %d bytes, more than %d", len(payload), MaxPayloadLen)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&n); err != nil {
		return n, bad("", "payload is not a notification: %s", clipped(err))
	}
	if dec.More() {
		return n, bad("", "payload has data after the notification")
	}
	if err := checkFieldNames(payload); err != nil {
		return n, err
	}
	return n, n.Check()
}

// payloadFields are the JSON names of Notification's fields.
var payloadFields = [...]string{"recipient", "policy", "provider", "template", "data", "send_by", "send_at", "tz", "campaign", "tenant", "queued_at"}

// checkFieldNames rejects what encoding/json lets through in an object it
// has decoded: a field named in another case ("Recipient": it matches
// names case-insensitively) or given twice (it keeps the last), either of
// which leaves a producer's mistake silently half-applied.
func checkFieldNames(payload []byte) error {
	var seen [len(payloadFields)]bool
	return Members(payload, func(name, _ []byte) error {
		i := slices.Index(payloadFields[:], string(name))
		if i < 0 {
			return bad(fmt.Sprintf("payload field %.40q", name), "field names are lower case (%s)", strings.Join(payloadFields[:], ", "))
		}
		if seen[i] {
			return bad(fmt.Sprintf("payload field %q", name), "given twice")
		}
		seen[i] = true
		return nil
	})
}

// Members calls f with the name and the value (its JSON text) of each
// member of the JSON object obj, in order, and returns f's first error. obj
// must be valid JSON whose top level is an object (json.Valid first): the
// scan only tracks nesting and skips strings, a fraction of the cost of
// json.Decoder.Token on the per-job path. A name is its bytes between the
// quotes, or as encoding/json reads it where it holds an escape or bytes
// that are not UTF-8.
func Members(obj []byte, f func(name, value []byte) error) error {
	depth, start := 0, -1 // start: where the value being read begins, or -1
	var name []byte
	for i := 0; i < len(obj); i++ {
		var err error
		switch obj[i] {
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 && start >= 0 { // the last member ends
				err = f(name, bytes.TrimSpace(obj[start:i]))
			}
		case ',':
			if depth == 1 {
				err, start = f(name, bytes.TrimSpace(obj[start:i])), -1
			}
		case ':':
			if depth == 1 {
				start = i + 1
			}
		case '"':
			end := i + 1
			for obj[end] != '"' {
				if obj[end] == '\\' {
					end++
				}
				end++
			}
			if depth == 1 && start < 0 {
				name = obj[i+1 : end]
				if bytes.IndexByte(name, '\\') >= 0 || !utf8.Valid(name) { // as encoding/json reads it
					var s string
					if err := json.Unmarshal(obj[i:end+1], &s); err != nil {
						return bad("", "payload is not a notification: %s", clipped(err))
					}
					name = []byte(s)
				}
			}
			i = end
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// idSpace makes task IDs derived from idempotency keys UUIDs of their own.
var idSpace = uuid.MustParse("6f1d5a0e-3c55-4b8e-9a43-6d0c1f3e2b7a")

// TaskID returns the task ID for a notification: a random UUID, or, when an
// idempotency key is given, a UUID derived from it (SHA-1, RFC 4122 v5), so
// the same notification enqueued twice is one job.
func TaskID(idempotencyKey string) string {
	if idempotencyKey == "" {
		return uuid.NewString()
	}
	return uuid.NewSHA1(idSpace, []byte(idempotencyKey)).String()
}

// NewTask returns the task for n, after checking it, with the given ID,
// stamped with the time it was queued unless n carries one, and held by
// asynq until n.SendAt if set (rounded up to a whole second). Options such
// as asynq.Queue are passed through.
func NewTask(n Notification, id string, opts ...asynq.Option) (*asynq.Task, error) {
	first := []asynq.Option{asynq.TaskID(id), asynq.MaxRetry(DefaultMaxRetry)}
	if n.SendAt != nil {
		at := WholeSecond(*n.SendAt) // before Check: rounded, it must still come before SendBy
		n.SendAt = &at
		first = append(first, asynq.ProcessAt(at))
	}
	if err := n.Check(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(id) == "" {
		return nil, bad("task ID", "missing")
	}
	if err := noControl("task ID", id); err != nil {
		return nil, err
	}
	if n.Queued == nil {
		now := time.Now().UTC().Truncate(time.Second) // a fixed length: payload sizes do not vary
		n.Queued = &now
	}
	payload, err := encode(n)
	if err != nil {
		return nil, fmt.Errorf("message: encode notification: %w", err)
	}
	if len(payload) > MaxPayloadLen {
		return nil, bad("", "payload of %d bytes, more than %d", len(payload), MaxPayloadLen)
	}
	return asynq.NewTaskWithHeaders(TaskType, payload, Headers(), append(first, opts...)...), nil
}

// WholeSecond is t rounded up to a whole second, in UTC: a SendAt as
// NewTask keeps it. asynq's schedule scores a task by its moment's Unix
// second and its forwarder moves what is due by the worker's clock's
// second: a moment within a second would run up to a second early, its
// rounded-up second never before it.
func WholeSecond(t time.Time) time.Time {
	at := t.UTC().Truncate(time.Second)
	if at.Before(t) {
		at = at.Add(time.Second)
	}
	return at
}

// LineHeader is the task header in which a notification keeps whether it
// holds a place in its tenant's line: "1" once a booking placed it there,
// "0" before (docs/booking.md, "Places in line: the horizon"). A task
// without headers cannot keep it, and counts as back from its place
// whenever it runs.
const LineHeader = "throttle-line"

// Headers are the headers a task starts with: not in line (LineHeader).
func Headers() map[string]string { return map[string]string{LineHeader: "0"} }

// encode marshals n without json.Marshal's HTML escaping, which writes <, >
// and & as six bytes each: a payload Decode accepted must not outgrow
// MaxPayloadLen just by being encoded again.
func encode(n Notification) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(n); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// DefaultMaxRetry is the retry budget of real delivery failures (5xx,
// timeouts). Deferrals by the throttle never use it (jobs.IsFailure).
const DefaultMaxRetry = 25

// LoadZone is timefmt.LoadZone with the error of a bad notification's
// field tz.
func LoadZone(name string) (*time.Location, error) {
	loc, err := timefmt.LoadZone(name)
	if err != nil {
		return nil, bad("tz", "%v", err)
	}
	return loc, nil
}
