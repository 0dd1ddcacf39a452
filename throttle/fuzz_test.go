package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/keyspace/keyspacetest"
)

// nastySubjects are the subjects (and task IDs) that try to break a key.
func nastySubjects() []string { return keyspacetest.NastySubjects() }

// validName is the rule-name oracle: 1-64 of A-Z a-z 0-9 _ . -.
func validName(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// The documented bounds of rules (rule.go): limits and bursts within
// [1, MaxLimit], windows within [1ms, MaxPer], rates within [MinRate,
// MaxRate], a bucket full within MaxPer, a quota take of at most MaxQuotaCost.
func inLimit(n int) bool         { return n >= 1 && n <= MaxLimit }
func inPer(d time.Duration) bool { return d >= time.Millisecond && d <= MaxPer }

func FuzzRuleValidation(f *testing.F) {
	type seed struct {
		kind   uint8
		name   string
		limit  int
		per    int64
		limit2 int
		per2   int64
		nwin   uint8
		rate   float64
		burst  int
		cost   int
	}
	seeds := []seed{
		{0, "weekly", 3, int64(168 * time.Hour), 1, int64(24 * time.Hour), 2, 1, 1, 1},
		{0, "q", 1, int64(time.Millisecond), 0, 0, 1, 0, 0, 2},
		{0, "q", 1, int64(time.Millisecond - 1), 0, 0, 1, 0, 0, 0},
		{0, "q", 0, int64(time.Hour), 0, 0, 1, 0, 0, 0},
		{0, "q", 5, int64(time.Hour), 2, int64(time.Hour), 0, 0, 0, 3},
		{0, "q", math.MaxInt, math.MaxInt64, math.MinInt, math.MinInt64, 2, 0, 0, math.MaxInt},
		{1, "sms", 0, 0, 0, 0, 0, 100, 20, 21},
		{1, "sms", 0, 0, 0, 0, 0, 0.2, 1, 1},
		{1, "sms", 0, 0, 0, 0, 0, -1, 5, 1},
		{1, "sms", 0, 0, 0, 0, 0, math.NaN(), 5, 1},
		{1, "sms", 0, 0, 0, 0, 0, math.Inf(1), 5, 1},
		{1, "sms", 0, 0, 0, 0, 0, math.SmallestNonzeroFloat64, math.MaxInt, -1},
		{1, "sms", 0, 0, 0, 0, 0, math.MaxFloat64, 0, 0},
		{0, "api", 1000, int64(time.Minute), 0, 0, 1, 0, 0, 1000},
		{0, "api", 1, 0, 0, 0, 1, 0, 0, 1},
		{0, "api", -1, -1, 0, 0, 1, 0, 0, 1},
		{0, "", 1, int64(time.Hour), 0, 0, 1, 0, 0, 1},
		{1, "sms gateway", 0, 0, 0, 0, 0, 1, 1, 1},
		{0, strings.Repeat("n", 64), 1, int64(time.Hour), 0, 0, 1, 0, 0, 1},
		{0, strings.Repeat("n", 65), 1, int64(time.Hour), 0, 0, 1, 0, 0, 1},
		{0, "{", 1, int64(time.Hour), 0, 0, 1, 0, 0, 1},
		{1, "a:b", 0, 0, 0, 0, 0, 1, 1, 1},
		{0, "日本", 1, int64(time.Hour), 0, 0, 1, 0, 0, 1},
		{0, "q\n", 1, int64(time.Hour), 0, 0, 1, 0, 0, 1},
	}
	for _, s := range seeds {
		f.Add(s.kind, s.name, s.limit, s.per, s.limit2, s.per2, s.nwin, s.rate, s.burst, s.cost)
	}
	f.Fuzz(func(t *testing.T, kind uint8, name string, limit int, per int64, limit2 int, per2 int64, nwin uint8, rate float64, burst int, cost int) {
		var (
			r       Rule
			err     error
			valid   bool
			maxCost int
		)
		switch kind % 2 {
		case 0:
			ws := []Window{{limit, time.Duration(per)}, {limit2, time.Duration(per2)}}[:nwin%3]
			valid = validName(name) && len(ws) > 0
			maxCost = MaxQuotaCost
			for _, w := range ws {
				valid = valid && inLimit(w.Limit) && inPer(w.Per)
				maxCost = min(maxCost, w.Limit)
			}
			var q *Quota
			q, err = NewQuota(name, ws...)
			if q != nil {
				r = q
			}
		case 1:
			valid = validName(name) && rate >= MinRate && rate <= MaxRate && inLimit(burst) &&
				float64(burst)/rate <= MaxPer.Seconds()
			maxCost = burst
			var b *Bucket
			b, err = NewBucket(name, rate, burst)
			if b != nil {
				r = b
			}
		}
		if !valid {
			if err == nil || !errors.Is(err, ErrInvalidRule) || r != nil {
				t.Fatalf("invalid rule accepted: rule %v, error %v", r, err)
			}
			return
		}
		if err != nil || r == nil {
			t.Fatalf("valid rule rejected: %v", err)
		}
		if r.MaxCost() < 1 || r.MaxCost() != maxCost {
			t.Errorf("MaxCost = %d, want %d", r.MaxCost(), maxCost)
		}
		if r.String() == "" || !utf8.ValidString(r.String()) {
			t.Errorf("String() = %q", r.String())
		}
		if r.Name() != name {
			t.Errorf("Name() = %q, want %q", r.Name(), name)
		}

		req := Request{ID: "fuzz", Takes: []Take{{Rule: r, Subject: "k", Cost: cost}}}
		err = req.validate()
		effective := max(cost, 1)
		switch {
		case cost < 0:
			if !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("cost %d: %v, want ErrInvalidRequest", cost, err)
			}
		case effective > r.MaxCost():
			if !errors.Is(err, ErrInvalidRule) {
				t.Errorf("cost %d above MaxCost %d: %v, want ErrInvalidRule", cost, r.MaxCost(), err)
			}
		default:
			if err != nil {
				t.Errorf("cost %d within MaxCost %d: %v", cost, r.MaxCost(), err)
			}
		}
		if m := r.MaxCost(); m < math.MaxInt {
			over := Request{ID: "fuzz", Takes: []Take{{Rule: r, Subject: "k", Cost: m + 1}}}
			if err := over.validate(); !errors.Is(err, ErrInvalidRule) {
				t.Errorf("cost MaxCost+1 = %d: %v, want ErrInvalidRule", m+1, err)
			}
			// Admit validates before it needs Redis.
			if _, err := (&Limiter{}).Admit(context.Background(), over); !errors.Is(err, ErrInvalidRule) {
				t.Errorf("Admit with cost MaxCost+1: %v, want ErrInvalidRule", err)
			}
		}
		at := Request{ID: "fuzz", Takes: []Take{{Rule: r, Subject: "k", Cost: r.MaxCost()}}}
		if err := at.validate(); err != nil {
			t.Errorf("cost MaxCost = %d: %v", r.MaxCost(), err)
		}
	})
}

// TestNastySubjectsGetDistinctKeys admits every nasty subject through a
// quota, a bucket and a calendar window on a real Redis: each subject gets
// its own four keys, each with exactly one hash tag, holding the encoded
// subject.
func TestNastySubjectsGetDistinctKeys(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "weekly", Window{3, 168 * time.Hour})
	b := mustBucket(t, "sms", 1.0/3600, 5)
	now := redisNow(t, l)
	c := mustCalendarWindow(t, 2, now.Add(-time.Hour), now.Add(time.Hour))
	subjects := nastySubjects()
	owner := map[string]string{} // key -> subject
	for i, s := range subjects {
		d, err := l.Admit(ctx, Request{ID: fmt.Sprint("n", i), Takes: []Take{{Rule: q, Subject: s}, {Rule: b, Subject: s}, {Rule: c, Subject: s}}})
		if err != nil || !d.Allowed() || d.Outcome == Repeated {
			t.Errorf("subject %q: %+v, %v; want allowed", s, d, err)
			continue
		}
		l.Sent(b, s, 1)
		tag := keyspace.Tag(DefaultPrefix, s)
		for _, k := range []string{keyspace.Quota(tag, "weekly"), keyspace.Sent(tag, "sms"), keyspace.Slots(tag, "sms"), keyspace.Calendar(tag, "cal")} {
			if o, ok := owner[k]; ok {
				t.Errorf("subjects %q and %q share key %q", o, s, k)
			}
			owner[k] = s
		}
	}
	stopped, stop := context.WithCancel(ctx)
	stop()
	l.CountSends(stopped) // writes the counts of Sent
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	want := make([]string, 0, len(owner))
	for k := range owner {
		want = append(want, k)
	}
	sort.Strings(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("Redis holds %d keys, want the %d built:\n%q\nwant\n%q", len(keys), len(want), keys, want)
	}
	for _, k := range keys {
		lo, hi := strings.Index(k, "{"), strings.Index(k, "}")
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || lo > hi {
			t.Errorf("key %q: want exactly one hash tag {...}", k)
			continue
		}
		if !strings.HasPrefix(k, DefaultPrefix+"{") {
			t.Errorf("key %q does not start with the prefix and the tag", k)
		}
		if got, want := k[lo+1:hi], encodeSubject(owner[k]); got != want {
			t.Errorf("key %q: tag %q, want %q", k, got, want)
		}
		for i := 0; i < len(k); i++ {
			if k[i] <= ' ' || k[i] >= 0x7f {
				t.Errorf("key %q: byte %q at %d", k, k[i], i)
				break
			}
		}
	}
}

// TestNastyIDs admits nasty task IDs through one quota, bucket and calendar
// window: each is its own task, a repeat is recognised, and IDs that are not
// valid never reach Redis.
func TestNastyIDs(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "weekly", Window{1000, 168 * time.Hour})
	b := mustBucket(t, "sms", 1.0/3600, 1000)
	now := redisNow(t, l)
	c := mustCalendarWindow(t, 1000, now.Add(-time.Hour), now.Add(time.Hour))
	takes := []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}, {Rule: c, Subject: "alice"}}
	var ids []string
	for _, id := range nastySubjects() {
		r := Request{ID: id, Takes: takes}
		if checkID(id) != nil {
			before := snapshot(t, rdb)
			if _, err := l.Admit(ctx, r); !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("ID %q: %v, want ErrInvalidRequest", id, err)
			}
			if !equalMaps(before, snapshot(t, rdb)) {
				t.Errorf("ID %q: an invalid request changed Redis", id)
			}
			continue
		}
		ids = append(ids, id)
		if d, err := l.Admit(ctx, r); err != nil || !d.Allowed() || d.Outcome == Repeated {
			t.Errorf("ID %q: %+v, %v; want allowed, new", id, d, err)
		}
	}
	for _, id := range ids {
		if d, err := l.Admit(ctx, Request{ID: id, Takes: takes}); err != nil || !d.Allowed() || d.Outcome != Repeated {
			t.Errorf("ID %q again: %+v, %v; want allowed, repeated", id, d, err)
		}
	}
	sort.Strings(ids)
	tagA, tagG := keyspace.Tag(DefaultPrefix, "alice"), keyspace.Tag(DefaultPrefix, "gw")
	if got := zmembers(t, rdb, keyspace.Quota(tagA, "weekly")); !slices.Equal(got, ids) {
		t.Errorf("quota holds %q, want %q", got, ids)
	}
	if got := ledgerIDs(t, rdb, tagG, "sms"); !slices.Equal(got, ids) {
		t.Errorf("ledger holds %q, want %q", got, ids)
	}
	if got := tokens(t, rdb, keyspace.Bucket(tagG, "sms"), 1.0/3600, 1000); got < float64(1000-len(ids)) || got > float64(1000-len(ids))+0.01 {
		t.Errorf("bucket tokens %v, want %d", got, 1000-len(ids))
	}
	if got := zmembers(t, rdb, keyspace.Calendar(tagA, "cal")); !slices.Equal(got, ids) {
		t.Errorf("calendar holds %q, want %q", got, ids)
	}
	// Releasing "%41" gives back its takes and leaves "A" alone.
	if n, err := l.Release(ctx, Request{ID: "%41", Takes: takes}); n != 3 || err != nil {
		t.Errorf("release %%41: %d, %v; want 3", n, err)
	}
	if d := mustAdmit(t, l, Request{ID: "A", Takes: takes}); !d.Allowed() || d.Outcome != Repeated {
		t.Errorf("A after %%41 was released: %+v, want still held (repeated)", d)
	}
}

// TestNastyRuleExtremes admits, on a real Redis, requests that validation
// accepts at the edges of what the constructors allow: every one must be
// decided without an error and report a remaining capacity that is not
// negative.
func TestNastyRuleExtremes(t *testing.T) {
	l, _ := newStandalone(t)
	mk := func(r Rule, err error) Rule {
		t.Helper()
		if err != nil {
			t.Fatalf("a rule within the documented bounds was rejected: %v", err)
		}
		return r
	}
	// Just past the bounds, the constructors and validation refuse.
	for _, err := range []error{
		func() error { _, err := NewQuota("q", Window{MaxLimit + 1, time.Hour}); return err }(),
		func() error { _, err := NewQuota("q", Window{1, MaxPer + 1}); return err }(),
		func() error { _, err := NewBucket("b", MinRate/2, 1); return err }(),
		func() error { _, err := NewBucket("b", MaxRate*2, 1); return err }(),
		func() error { _, err := NewBucket("b", 1, MaxLimit+1); return err }(),
		func() error { _, err := NewBucket("b", MinRate, MaxLimit); return err }(), // would take 31.7 million years to fill
		Request{ID: "x", Takes: []Take{{Rule: mk(NewQuota("q", Window{10000, time.Hour})), Subject: "k", Cost: MaxQuotaCost + 1}}}.validate(),
	} {
		if !errors.Is(err, ErrInvalidRule) {
			t.Errorf("past the bounds: %v, want ErrInvalidRule", err)
		}
	}
	tests := []struct {
		name string
		rule Rule
		cost int
		// gone: the take may have left its 1ms window, or its bucket slot
		// (µs at MaxRate) ended, before the release.
		gone bool
	}{
		{"quota cost MaxQuotaCost", mk(NewQuota("big", Window{MaxLimit, time.Hour})), MaxQuotaCost, false},
		{"quota limit MaxLimit", mk(NewQuota("huge", Window{MaxLimit, time.Hour})), 1, false},
		{"quota window MaxPer", mk(NewQuota("long", Window{1, MaxPer})), 1, false},
		{"quota window 1ms", mk(NewQuota("short", Window{1, time.Millisecond})), 1, true},
		{"bucket rate MinRate", mk(NewBucket("slow", MinRate, 1)), 1, false},
		{"bucket slowest fill", mk(NewBucket("slowest", MinRate, int(MaxPer.Seconds()*MinRate))), 1, false},
		{"bucket rate MaxRate", mk(NewBucket("fast", MaxRate, 5)), 5, true},
		{"bucket burst MaxLimit", mk(NewBucket("deep", MaxRate, MaxLimit)), MaxLimit, true},
		{"bucket burst MaxLimit, slow", mk(NewBucket("deepslow", 10, MaxLimit)), 1, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Request{ID: fmt.Sprint("x", i), Takes: []Take{{Rule: tc.rule, Subject: fmt.Sprint("k", i), Cost: tc.cost}}}
			if err := r.validate(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			d, err := l.Admit(ctx, r)
			if err != nil {
				t.Fatalf("a request validation accepts failed in Redis: %v", err)
			}
			if !d.Allowed() || d.Remaining < 0 {
				t.Errorf("%+v, want allowed with a remaining capacity >= 0", d)
			}
			if n, err := l.Release(ctx, r); err != nil || (n != 1 && !tc.gone) {
				t.Errorf("release: %d, %v; want 1", n, err)
			}
		})
	}
}
