package lifecycle

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// newRecorder returns a recorder on a database of its own, with callbacks
// for tenant "billing".
func newRecorder(t *testing.T, o Options) (*Recorder, *redis.Client) {
	t.Helper()
	rdb, _ := shared.NewClient(t)
	if o.Callbacks == nil {
		o.Callbacks = map[string]Endpoint{"billing": {URL: "http://127.0.0.1:1/events", Secret: "s"}}
	}
	return NewRecorder(rdb, o), rdb
}

// types lists the events' types in order.
func types(events []Event) []Type {
	var ts []Type
	for _, e := range events {
		ts = append(ts, e.Type)
	}
	return ts
}

// TestHistory: a message's history lists its events in the order they were
// recorded but for its accepted event, which is first even when recorded
// last; an event recorded twice is listed once; every event carries the
// idempotency key of the accepted one; the history expires History after
// its first push.
func TestHistory(t *testing.T) {
	ctx := context.Background()
	r, rdb := newRecorder(t, Options{History: time.Hour})
	at := time.Date(2025, 6, 10, 8, 0, 0, 0, time.UTC)
	booked := Event{Type: Booked, Message: "m1", Tenant: "billing", At: at, Moment: Moment(at.Add(3 * time.Second)), Rule: "provider sms (2/s burst 2)"}
	sent := Event{Type: Sent, Message: "m1", Tenant: "billing", Provider: "sms"}
	if err := r.Record(ctx, booked); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(ctx, sent, booked); err != nil { // booked again: a redelivery
		t.Fatal(err)
	}
	if err := r.Record(ctx, Event{Type: Accepted, Message: "m1", Tenant: "billing", Via: ViaAPI, IdempotencyKey: "welcome-alice"}); err != nil {
		t.Fatal(err)
	}
	got, err := r.History(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []Type{Accepted, Booked, Sent}; !slices.Equal(types(got), want) {
		t.Fatalf("history %v, want %v", types(got), want)
	}
	for _, e := range got {
		if e.IdempotencyKey != "welcome-alice" || e.Message != "m1" || e.Tenant != "billing" || len(e.ID) != 32 || e.At.IsZero() {
			t.Errorf("event %+v: want its ID, message, tenant, time and the accepted event's key", e)
		}
	}
	if !got[1].At.Equal(at) || !got[1].Moment.Equal(at.Add(3*time.Second)) {
		t.Errorf("booked at %v for %v, want the times it was recorded with", got[1].At, got[1].Moment)
	}
	if n := rdb.LLen(ctx, historyKey(keyspace.DefaultPrefix, "m1")).Val(); n != 4 {
		t.Errorf("the history holds %d events, want 4: the booking recorded twice is pushed twice (and read once)", n)
	}
	if ttl := rdb.PTTL(ctx, historyKey(keyspace.DefaultPrefix, "m1")).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("history's TTL %v, want about Options.History (1h)", ttl)
	}
	if none, err := r.History(ctx, "never"); err != nil || len(none) != 0 {
		t.Errorf("history of a message never recorded: %v, %v; want none", none, err)
	}
}

// TestHistoryLimit: past HistoryLimit, the oldest event after the first
// goes, so the first (how it was accepted, with its key) and the latest
// stay.
func TestHistoryLimit(t *testing.T) {
	ctx := context.Background()
	r, _ := newRecorder(t, Options{HistoryLimit: 4})
	events := []Event{{Type: Accepted, Message: "m", Via: ViaEnqueue, IdempotencyKey: "k"}}
	base := time.Now()
	for i := range 6 {
		events = append(events, Event{Type: Deferred, Message: "m", Until: Moment(base.Add(time.Duration(i) * time.Second)), Rule: "policy p"})
	}
	for _, e := range events {
		if err := r.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := r.History(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	var untils []time.Time
	for _, e := range got[1:] {
		untils = append(untils, *e.Until)
	}
	want := []time.Time{base.Add(3 * time.Second), base.Add(4 * time.Second), base.Add(5 * time.Second)}
	for i := range want {
		want[i] = want[i].UTC().Truncate(time.Millisecond)
	}
	if len(got) != 4 || got[0].Type != Accepted || !reflect.DeepEqual(untils, want) {
		t.Errorf("history %v (deferred until %v), want accepted and the 3 latest deferrals %v", types(got), untils, want)
	}
}

// TestEventIDs: the same outcome of the same message has the same ID
// wherever it is recorded; another outcome of the same type (a booking at
// another moment), another type or another message has another.
func TestEventIDs(t *testing.T) {
	now := time.Now()
	at := now.Add(time.Minute)
	id := func(e Event) string { e.fill(now); return e.ID }
	booked := Event{Type: Booked, Message: "m1", Moment: Moment(at), Rule: "r"}
	sameLater := booked
	sameLater.At, sameLater.Rule = now.Add(time.Hour), "recorded again, later, by another worker"
	for _, tt := range []struct {
		name string
		a, b Event
		same bool
	}{
		{"a booking recorded twice", booked, sameLater, true},
		{"a booking at another moment", booked, Event{Type: Booked, Message: "m1", Moment: Moment(at.Add(time.Second))}, false},
		{"another message", booked, Event{Type: Booked, Message: "m2", Moment: Moment(at)}, false},
		{"sent twice", Event{Type: Sent, Message: "m1", Provider: "a"}, Event{Type: Sent, Message: "m1", Provider: "a", ProviderMessageID: "p1"}, true},
		{"sent and accepted", Event{Type: Sent, Message: "m1"}, Event{Type: Accepted, Message: "m1"}, false},
		{"archived for two reasons", Event{Type: Archived, Message: "m1", Reason: ArchivedRejected}, Event{Type: Archived, Message: "m1", Reason: ArchivedDead}, false},
		{"folded into one digest twice", Event{Type: Folded, Message: "m1", Digest: "d1", Moment: Moment(at)}, Event{Type: Folded, Message: "m1", Digest: "d1"}, true},
		{"delivered reported twice", Event{Type: Delivered, Message: "m1", ProviderMessageID: "p1", Detail: "250 ok"}, Event{Type: Delivered, Message: "m1", ProviderMessageID: "p1"}, true},
		{"a soft bounce, then a hard one", Event{Type: Bounced, Message: "m1", ProviderMessageID: "p1", Reason: BouncedSoft}, Event{Type: Bounced, Message: "m1", ProviderMessageID: "p1", Reason: BouncedHard}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := id(tt.a), id(tt.b); (a == b) != tt.same {
				t.Errorf("IDs %s and %s: same %v, want %v", a, b, a == b, tt.same)
			}
		})
	}
}

// TestStreams: an event of a tenant with a callback goes to the tenant's
// stream too, as the JSON the history keeps; one of a tenant without, to
// its history alone.
func TestStreams(t *testing.T) {
	ctx := context.Background()
	r, rdb := newRecorder(t, Options{})
	if err := r.Record(ctx, Event{Type: Sent, Message: "a", Tenant: "billing", Provider: "sms"},
		Event{Type: Sent, Message: "b", Tenant: "growth", Provider: "sms"}); err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(ctx, streamKey(keyspace.DefaultPrefix, "billing"), "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("billing's stream: %v, %v; want one entry", entries, err)
	}
	history := rdb.LRange(ctx, historyKey(keyspace.DefaultPrefix, "a"), 0, -1).Val()
	if len(history) != 1 || entries[0].Values["e"] != history[0] {
		t.Errorf("stream entry %v, history %v: want the same JSON", entries[0].Values, history)
	}
	if n := rdb.Exists(ctx, streamKey(keyspace.DefaultPrefix, "growth")).Val(); n != 0 {
		t.Errorf("growth has no callback, yet a stream")
	}
	var e map[string]any
	if err := json.Unmarshal([]byte(history[0]), &e); err != nil || !strings.HasPrefix(history[0], `{"id":"`) {
		t.Errorf("history holds %q: want JSON opening with its id (history.lua looks for it there)", history[0])
	}
}

// TestRecordAfterScriptFlush: a Redis that lost its scripts (restarted,
// SCRIPT FLUSH) still takes events.
func TestRecordAfterScriptFlush(t *testing.T) {
	ctx := context.Background()
	r, rdb := newRecorder(t, Options{})
	if err := r.Record(ctx, Event{Type: Sent, Message: "a", Tenant: "billing"}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(ctx, Event{Type: Canceled, Message: "b", Tenant: "billing"}); err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
	if got, _ := r.History(ctx, "b"); len(got) != 1 {
		t.Errorf("history of b: %v, want the canceled event", got)
	}
	if n := rdb.XLen(ctx, streamKey(keyspace.DefaultPrefix, "billing")).Val(); n != 2 {
		t.Errorf("billing's stream has %d entries, want 2 (one per event, none twice)", n)
	}
}

// TestNowIsRedisClock: Now follows Redis TIME, not this process's clock.
func TestNowIsRedisClock(t *testing.T) {
	ctx := context.Background()
	r, rdb := newRecorder(t, Options{})
	r.clock.offset, r.clock.measured = time.Hour, time.Now() // as if this clock ran an hour ahead, measured
	if got := r.Now(ctx); time.Until(got) > -59*time.Minute {
		t.Fatalf("Now %v: the measured offset is not used", got)
	}
	r.clock.measured = time.Time{} // stale: measured again
	redisNow := rdb.Time(ctx).Val()
	if got := r.Now(ctx); got.Sub(redisNow).Abs() > time.Second {
		t.Errorf("Now %v, Redis TIME %v", got, redisNow)
	}
}

// TestTenants: a message's tenant is read from its history, whichever
// event came first; a message without a history is left out.
func TestTenants(t *testing.T) {
	ctx := context.Background()
	r, _ := newRecorder(t, Options{})
	if err := r.Record(ctx, Event{Type: Accepted, Message: "a", Tenant: "billing", Via: ViaAPI},
		Event{Type: Sent, Message: "b", Provider: "sms"}); err != nil {
		t.Fatal(err)
	}
	got, err := r.Tenants(ctx, "a", "b", "never", "a")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a": "billing", "b": ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("Tenants = %v, want %v", got, want)
	}
}
