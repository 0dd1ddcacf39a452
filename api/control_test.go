package api

import (
	"net/http"
	"testing"
)

// TestControlCharactersRefused: the API refuses what intake refuses (a
// control character in the template or the key, a blank recipient), and a
// control character in the Idempotency-Key header, naming where each was.
func TestControlCharactersRefused(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name, body, header, field string
	}{
		{"NUL in the template", `{"recipient":"a@example.com","template":"t\u0000"}`, "", "/template"},
		{"ESC in the template", `{"recipient":"a@example.com","template":"\u001b[2J"}`, "", "/template"},
		{"NUL in the key", `{"recipient":"a@example.com","template":"t","idempotency_key":"\u0000"}`, "", "/idempotency_key"},
		{"a recipient of spaces", `{"recipient":"   ","template":"t"}`, "", "/recipient"},
		{"a tab in the header's key", welcome, "a\tb", IdempotencyHeader},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h []string
			if c.header != "" {
				h = []string{IdempotencyHeader, c.header}
			}
			r := f.post(billingKey, c.body, h...)
			if code, field := r.errorOf(t); r.status != http.StatusBadRequest || code != CodeInvalid || field != c.field {
				t.Errorf("%d %s %q, want 400 %s %q", r.status, code, field, CodeInvalid, c.field)
			}
		})
	}
	if q, _ := f.insp.GetQueueInfo("default"); q != nil && q.Pending != 0 {
		t.Errorf("%d enqueued, want none", q.Pending)
	}
}
