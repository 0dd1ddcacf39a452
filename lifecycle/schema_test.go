package lifecycle

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// schema is event.schema.json, as much of it as the tests read.
type schema struct {
	Required   []string `json:"required"`
	Properties map[string]struct {
		Enum []string `json:"enum"`
	} `json:"properties"`
	AllOf []struct {
		If struct {
			Properties struct {
				Type struct {
					Const string `json:"const"`
				} `json:"type"`
			} `json:"properties"`
		} `json:"if"`
		Then struct {
			Required []string `json:"required"`
		} `json:"then"`
	} `json:"allOf"`
}

func loadSchema(t *testing.T) schema {
	t.Helper()
	var s schema
	if err := json.Unmarshal(Schema, &s); err != nil {
		t.Fatalf("event.schema.json: %v", err)
	}
	return s
}

// TestSchemaMatchesEvent: event.schema.json names exactly Event's JSON
// members, requires those Event always has, and lists exactly the types
// and the vias.
func TestSchemaMatchesEvent(t *testing.T) {
	s := loadSchema(t)
	var members, always []string
	for f := range reflect.TypeFor[Event]().Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		members = append(members, name)
		if opts != "omitempty" {
			always = append(always, name)
		}
	}
	var props []string
	for p := range s.Properties {
		props = append(props, p)
	}
	slices.Sort(members)
	slices.Sort(props)
	if !slices.Equal(props, members) {
		t.Errorf("the schema's properties %v, Event's members %v", props, members)
	}
	if slices.Sort(always); !slices.Equal(slices.Sorted(slices.Values(s.Required)), always) {
		t.Errorf("the schema requires %v, Event always has %v", s.Required, always)
	}
	var want []string
	for _, ty := range Types {
		want = append(want, string(ty))
	}
	if got := s.Properties["type"].Enum; !slices.Equal(got, want) {
		t.Errorf("the schema's types %v, Types %v", got, want)
	}
	if got := s.Properties["via"].Enum; !slices.Equal(got, []string{ViaAPI, ViaEnqueue, ViaCampaign}) {
		t.Errorf("the schema's vias %v", got)
	}
}

// TestRecordedEventsFitTheSchema: what the recorder writes for each type
// the worker, the API and the providers' feedback record has every member
// the schema requires of that type.
func TestRecordedEventsFitTheSchema(t *testing.T) {
	ctx := context.Background()
	r, _ := newRecorder(t, Options{})
	at := time.Now()
	events := []Event{
		{Type: Accepted, Message: "m", Via: ViaAPI, IdempotencyKey: "k"},
		{Type: Booked, Message: "m", Moment: Moment(at), Rule: "provider sms (1/s burst 1)"},
		{Type: Deferred, Message: "m", Until: Moment(at), Rule: "policy p (1 per 1h)"},
		{Type: Deferred, Message: "m", Until: Moment(at.Add(time.Second)), Provider: "sms", Detail: "429"},
		{Type: Sent, Message: "m", Provider: "sms"},
		{Type: Dropped, Message: "m", Rule: "policy p (1 per 1h)"},
		{Type: Expired, Message: "m", Reason: "send-by 2025-06-10T08:00:00Z", Rule: "policy p (1 per 1h)"},
		{Type: Folded, Message: "m", Digest: "d", Moment: Moment(at)},
		{Type: Archived, Message: "m", Reason: ArchivedRejected, Provider: "sms", Detail: "400"},
		{Type: Canceled, Message: "m"},
		{Type: Delivered, Message: "m", Provider: "email", ProviderMessageID: "p1"},
		{Type: Bounced, Message: "m", Provider: "email", ProviderMessageID: "p1", Reason: BouncedHard, Detail: "550 5.1.1"},
		{Type: Complained, Message: "m", Provider: "email", ProviderMessageID: "p1"},
		{Type: Unsubscribed, Message: "m", Provider: "email", ProviderMessageID: "p1"},
	}
	if err := r.Record(ctx, events...); err != nil {
		t.Fatal(err)
	}
	raw := r.rdb.LRange(ctx, historyKey(r.o.Prefix, "m"), 0, -1).Val()
	s := loadSchema(t)
	for _, body := range raw {
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatal(err)
		}
		required := slices.Clone(s.Required)
		for _, c := range s.AllOf {
			if c.If.Properties.Type.Const == m["type"] {
				required = append(required, c.Then.Required...)
			}
		}
		for _, k := range required {
			if _, ok := m[k]; !ok {
				t.Errorf("%s event %s lacks %q, which the schema requires", m["type"], body, k)
			}
		}
	}
	if len(raw) != len(events) {
		t.Errorf("%d events recorded, want %d", len(raw), len(events))
	}
}
