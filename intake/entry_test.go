package intake

import (
	"errors"
	"testing"
)

// TestErrorNamesTheField: every refusal of ParseLine is an *Error whose
// Field is the member at fault ("" for the line as a whole), with the text
// enqueue prints.
func TestErrorNamesTheField(t *testing.T) {
	cases := []struct {
		line, field, text string
	}{
		{`{"recipient":`, "", "not JSON: the line ends inside a value"},
		{`[1]`, "", "must be a JSON object (got array)"},
		{`{"recipient":1}`, "recipient", "recipient: must be a string (got number)"},
		{`{"data":[]}`, "data", "data: must be a JSON object (got array)"},
		{`{"send_by":"soon"}`, "send_by", `send_by: must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got "soon")`},
		{`{"tz":"a","tz":"b"}`, "tz", "tz: given twice"},
		{`{"templte":"t"}`, "templte", `unknown field "templte" (did you mean template?)`},
		{`{"x/y":1}`, "x/y", `unknown field "x/y" (fields: recipient, template, policy, provider, queue, data, idempotency_key, send_by, send_at, send_at_local, tz, tenant)`},
	}
	for _, c := range cases {
		_, err := ParseLine([]byte(c.line))
		var e *Error
		if !errors.As(err, &e) || e.Field != c.field || err.Error() != c.text {
			t.Errorf("ParseLine(%s) = %v (%#v), want field %q and %q", c.line, err, e, c.field, c.text)
		}
	}
}
