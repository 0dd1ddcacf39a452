package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDecodeRejectsMalformedPayloads(t *testing.T) {
	tests := []struct {
		name, payload, want string
	}{
		{"not JSON", `hello`, "payload is not a notification: invalid character 'h' looking for beginning of value: bad notification"},
		{"no recipient", `{"policy":"p","provider":"x","template":"t"}`, "recipient: missing: bad notification"},
		{"unknown field", `{"recipient":"a","policy":"p","provider":"x","template":"t","colour":1}`, `payload is not a notification: json: unknown field "colour": bad notification`},
		{"field in another case", `{"Recipient":"a","policy":"p","provider":"x","template":"t"}`, `payload field "Recipient": field names are lower case (recipient, policy, provider, template, data, send_by, send_at, tz, campaign, tenant, queued_at): bad notification`},
		{"field twice", `{"recipient":"a","policy":"p","provider":"x","template":"t","recipient":"b"}`, `payload field "recipient": given twice: bad notification`},
		{"a moment after its send-by", `{"recipient":"a","policy":"p","provider":"x","template":"t","send_by":"2030-01-01T00:00:00Z","send_at":"2030-01-01T00:00:01Z"}`, "send_at: 2030-01-01T00:00:01Z is after send_by 2030-01-01T00:00:00Z: it would only expire: bad notification"},
		{"trailing data", `{"recipient":"a","policy":"p","provider":"x","template":"t"} {}`, "payload has data after the notification: bad notification"},
		{"long recipient", `{"recipient":"` + strings.Repeat("a", MaxRecipientLen+1) + `","policy":"p","provider":"x","template":"t"}`, "recipient: 257 bytes, longer than 256: bad notification"},
		{"long tenant", `{"recipient":"a","policy":"p","provider":"x","template":"t","tenant":"` + strings.Repeat("é", 129) + `"}`, "tenant: 258 bytes, longer than 256: bad notification"},
		{"tenant with a control character", `{"recipient":"a","policy":"p","provider":"x","template":"t","tenant":"team\ta"}`, "tenant: control character U+0009 (byte 5): bad notification"},
		{"tenant with a C1 control character", `{"recipient":"a","policy":"p","provider":"x","template":"t","tenant":"\u0085"}`, "tenant: control character U+0085 (byte 1): bad notification"},
		{"tenant not a string", `{"recipient":"a","policy":"p","provider":"x","template":"t","tenant":7}`, "payload is not a notification: json: cannot unmarshal number into Go struct field Notification.tenant of type string: bad notification"},
		{"too big", `{"recipient":"a","data":"` + strings.Repeat("x", MaxPayloadLen) + `"}`, "payload of 65563 bytes, more than 65536: bad notification"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.payload))
			if err == nil || err.Error() != tc.want || !errors.Is(err, ErrBadPayload) {
				t.Errorf("got  %v\nwant %s", err, tc.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Error()+": bad notification" != tc.want {
				t.Errorf("FieldError %v does not make %q", fe, tc.want)
			}
		})
	}
}

// TestDecodeTenant: a tenant is optional, and one of MaxTenantLen bytes, any
// UTF-8 but control characters, round-trips through a task.
func TestDecodeTenant(t *testing.T) {
	for _, tenant := range []string{"", "billing", "équipe ☃ 7", strings.Repeat("t", MaxTenantLen)} {
		n := Notification{Recipient: "a", Policy: "p", Provider: "x", Template: "t", Tenant: tenant}
		task, err := NewTask(n, "id")
		if err != nil {
			t.Fatalf("tenant %q: %v", tenant, err)
		}
		if tenant == "" && bytes.Contains(task.Payload(), []byte(`"tenant"`)) {
			t.Errorf("no tenant, but the payload names one: %s", task.Payload())
		}
		back, err := Decode(task.Payload())
		if err != nil || back.Tenant != tenant {
			t.Errorf("tenant %q: decoded %q, %v", tenant, back.Tenant, err)
		}
	}
}

func TestTaskIDFromIdempotencyKey(t *testing.T) {
	first, again := TaskID("order-42"), TaskID("order-42")
	if first != again {
		t.Error("the same idempotency key gave two task IDs")
	}
	other, noKey, noKeyAgain := TaskID("order-43"), TaskID(""), TaskID("")
	if first == other || noKey == noKeyAgain {
		t.Error("different notifications share a task ID")
	}
}

// TestNewTaskKeepsHTMLCharacters: a payload of <, > and & that Decode
// accepts near the size limit must stay under it when NewTask encodes it
// again (json.Marshal would write each as six bytes).
func TestNewTaskKeepsHTMLCharacters(t *testing.T) {
	n := Notification{Recipient: "a&b", Policy: "p", Provider: "x", Template: "<t>",
		Data: json.RawMessage(`"` + strings.Repeat("<&>", (MaxPayloadLen-150)/3) + `"`)} // room for queued_at
	task, err := NewTask(n, "id")
	if err != nil {
		t.Fatal(err)
	}
	if len(task.Payload()) > MaxPayloadLen || bytes.Contains(task.Payload(), []byte(`\u003c`)) {
		t.Fatalf("payload of %d bytes, escaped: %v", len(task.Payload()), bytes.Contains(task.Payload(), []byte(`\u003c`)))
	}
	back, err := Decode(task.Payload())
	if err != nil || back.Recipient != n.Recipient || back.Template != n.Template || !bytes.Equal(back.Data, n.Data) {
		t.Fatalf("round trip: %v, %+v", err, back)
	}
}

// TestNewTaskSendAt: a scheduled notification's task carries its moment
// rounded up to a whole second, the one asynq's schedule holds it until,
// and one whose rounded moment passes its send-by is refused naming
// send_at.
func TestNewTaskSendAt(t *testing.T) {
	at := time.Date(2031, 5, 4, 9, 0, 0, 250e6, time.FixedZone("x", 3600))
	task, err := NewTask(Notification{Recipient: "a", Policy: "p", Provider: "x", Template: "t", SendAt: &at}, "id")
	if err != nil {
		t.Fatal(err)
	}
	n, err := Decode(task.Payload())
	if want := time.Date(2031, 5, 4, 8, 0, 1, 0, time.UTC); err != nil || n.SendAt == nil || !n.SendAt.Equal(want) {
		t.Errorf("send_at in the payload %v (%v), want %s", n.SendAt, err, want)
	}
	if !strings.Contains(string(task.Payload()), `"send_at":"2031-05-04T08:00:01Z"`) {
		t.Errorf("payload %s, want send_at in UTC", task.Payload())
	}
	by := at.Add(500 * time.Millisecond) // after the moment, before its second ends
	_, err = NewTask(Notification{Recipient: "a", Policy: "p", Provider: "x", Template: "t", SendAt: &at, SendBy: &by}, "id")
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "send_at" || !strings.Contains(fe.Problem, "is after send_by") {
		t.Errorf("a moment rounded past its send-by: %v, want a refusal naming send_at", err)
	}
}

func TestDecodeChecksTheTimeZone(t *testing.T) {
	base := `{"recipient":"a","policy":"p","provider":"x","template":"t","tz":`
	if n, err := Decode([]byte(base + `"America/New_York"}`)); err != nil || n.TZ != "America/New_York" {
		t.Fatalf("a known zone: %+v, %v", n, err)
	}
	for _, tz := range []string{`"Mars/Olympus_Mons"`, `"Local"`, `"europe/paris"`} {
		_, err := Decode([]byte(base + tz + `}`))
		want := "tz: unknown time zone " + tz + " (an IANA zone such as Europe/Paris): bad notification"
		if err == nil || err.Error() != want {
			t.Errorf("tz %s: got %v, want %s", tz, err, want)
		}
	}
}
