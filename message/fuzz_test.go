package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// decodeSeeds are payloads on both sides of every check Decode makes.
func decodeSeeds() []string {
	ok := `{"recipient":"alice@example.com","policy":"marketing","provider":"sms","template":"welcome"}`
	return []string{
		ok,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","data":{"name":"Al","n":[1,2.5,null,true]},"send_by":"2026-01-02T03:04:05.123456789+02:00","campaign":"spring"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","data":null}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","tenant":"billing","campaign":"spring"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","tenant":"\u2028\u007f"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","data":"<&>"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","data":{ "spaced" : [ 1 , 2 ] }}`,
		`{"RECIPIENT":"a","Policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"a","recipient":"b","policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"x}:q:marketing","policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"{alice}","policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"\u0000\n\ud800","policy":"p","provider":"x","template":"t"}`,
		"{\"recipient\":\"\xff\xfe\",\"policy\":\"p\",\"provider\":\"x\",\"template\":\"t\"}",
		`{"recipient":"` + strings.Repeat("a", MaxRecipientLen) + `","policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"` + strings.Repeat("a", MaxRecipientLen+1) + `","policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"` + strings.Repeat("é", MaxRecipientLen/2) + `","policy":"p","provider":"x","template":"t"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"` + strings.Repeat("t", MaxTemplateLen+1) + `"}`,
		// Just within the size limit, and with HTML characters that
		// json.Marshal escapes to six bytes each.
		`{"recipient":"a","policy":"p","provider":"x","template":"t","data":"` + strings.Repeat("x", MaxPayloadLen-80) + `"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","data":"` + strings.Repeat("<", MaxPayloadLen-80) + `"}`,
		`{"recipient":"a","data":"` + strings.Repeat("x", MaxPayloadLen) + `"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","send_by":"yesterday"}`,
		`{"recipient":"a","policy":"p","provider":"x","template":"t","colour":1}`,
		ok + ` {}`, ok + `x`, ok + "\n", `[` + ok + `]`,
		``, `null`, `{}`, `"x"`, `{"recipient":1}`, `{"data":{"a":`, strings.Repeat("[", 10000),
	}
}

// FuzzDecode checks that Decode never panics, that what it accepts fits the
// limits, and that an accepted notification survives NewTask and Decode
// unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		n, err := Decode(payload)
		if err != nil {
			if !errors.Is(err, ErrBadPayload) {
				t.Fatalf("error %v does not wrap ErrBadPayload", err)
			}
			if len(err.Error()) > 1024 {
				t.Fatalf("error of %d bytes: a message must not echo the payload", len(err.Error()))
			}
			return
		}
		if len(payload) > MaxPayloadLen {
			t.Fatalf("accepted a payload of %d bytes", len(payload))
		}
		if len(n.Recipient) > MaxRecipientLen || len(n.Template) > MaxTemplateLen ||
			len(n.Policy) > MaxTemplateLen || len(n.Provider) > MaxTemplateLen || len(n.Tenant) > MaxTenantLen {
			t.Fatalf("accepted a field over its limit: %q", payload)
		}
		if err := n.Check(); err != nil {
			t.Fatalf("Decode accepted what Check rejects: %v", err)
		}

		task, err := NewTask(n, "fuzz-id")
		if err != nil {
			// Re-encoding may still grow a payload a little (U+2028 and
			// U+2029 in a field are written as \u2028), past the limit:
			// only then may it fail. HTML characters (<, >, &) do not grow it.
			if !errors.Is(err, ErrBadPayload) || !strings.HasPrefix(err.Error(), "payload of ") {
				t.Fatalf("NewTask of a decoded notification: %v", err)
			}
			return
		}
		if task.Type() != TaskType || len(task.Payload()) > MaxPayloadLen {
			t.Fatalf("task of type %q and %d bytes", task.Type(), len(task.Payload()))
		}
		again, err := Decode(task.Payload())
		if err != nil {
			t.Fatalf("Decode of NewTask's payload %q: %v", task.Payload(), err)
		}
		if n.Queued == nil { // NewTask stamps one
			if again.Queued == nil {
				t.Fatalf("NewTask left queued_at out: %s", task.Payload())
			}
			n.Queued = again.Queued
		}
		if !sameNotification(n, again) {
			t.Fatalf("round trip changed the notification:\n got %+v\nwant %+v", again, n)
		}
		task2, err := NewTask(again, "fuzz-id")
		if err != nil || !bytes.Equal(task2.Payload(), task.Payload()) {
			t.Fatalf("second NewTask: %v; payload\n%s\nthen\n%s", err, task.Payload(), task2.Payload())
		}
	})
}

// FuzzMemberNames checks Members, the scan behind Decode's field name
// check and enqueue's lines, against encoding/json's own tokenizer on every
// valid JSON object: the same names and values in the same order.
func FuzzMemberNames(f *testing.F) {
	for _, s := range decodeSeeds() {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"a\"b":{"c":[1,{"d":"}"}]},"e\\":"\"","f":[],"\u0072ecipient":null}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		if !json.Valid(payload) || jsonTopKind(payload) != '{' {
			return
		}
		var got []string
		if err := Members(payload, func(name, value []byte) error {
			got = append(got, string(name), string(value))
			return nil
		}); err != nil {
			t.Fatalf("Members: %v", err)
		}
		if want := membersByTokens(t, payload); !slices.Equal(got, want) {
			t.Fatalf("names and values %q, encoding/json reads %q", got, want)
		}
	})
}

// jsonTopKind returns the first non-space byte of a JSON text.
func jsonTopKind(b []byte) byte {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
	}
	return 0
}

// membersByTokens reads the top-level member names of a JSON object
// and values with json.Decoder.Token: the reference for Members.
func membersByTokens(t *testing.T, payload []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			t.Fatal(err)
		}
		names = append(names, tok.(string), string(value))
	}
	return names
}

// sameNotification compares two notifications as JSON values, so data
// whitespace and the spelling of a time do not count, and a field added to
// Notification later is compared too.
func sameNotification(a, b Notification) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && sameJSON(ja, jb)
}

func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// TestDecodeLimitEdges pins what FuzzDecode's properties cannot: that
// Decode accepts what is just within the limits.
func TestDecodeLimitEdges(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		ok      bool
	}{
		{"recipient at the limit", `{"recipient":"` + strings.Repeat("a", MaxRecipientLen) + `","policy":"p","provider":"x","template":"t"}`, true},
		{"key-like recipient", `{"recipient":"x}:q:marketing","policy":"p","provider":"x","template":"t"}`, true},
		{"payload at the limit", `{"recipient":"a","policy":"p","provider":"x","template":"t","data":"` + strings.Repeat("x", MaxPayloadLen-70) + `"}`, true},
		{"payload one byte over", `{"recipient":"a","policy":"p","provider":"x","template":"t","data":"` + strings.Repeat("x", MaxPayloadLen-69) + `"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode([]byte(tt.payload)); (err == nil) != tt.ok {
				t.Errorf("Decode: %v, want ok=%t", err, tt.ok)
			}
		})
	}
}
