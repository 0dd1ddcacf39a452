package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

var ctx = context.Background()

func TestQuotaDelayIsUntilTheBlockingEntryLeaves(t *testing.T) {
	l, _ := newStandalone(t)
	q := mustQuota(t, "mkt", Window{1, 400 * time.Millisecond}, Window{2, 2 * time.Second})
	take := []Take{{Rule: q, Subject: "alice"}}

	a := mustAdmit(t, l, Request{ID: "a", Takes: take})
	if !a.Allowed() || a.Remaining != 0 {
		t.Fatalf("first admission: %+v, want allowed with 0 remaining", a)
	}
	// Denied by the short window: it frees when a's entry is 400ms old.
	b := mustAdmit(t, l, Request{ID: "b", Takes: take})
	if b.Allowed() || b.TakeIndex != 0 || b.Limit != "1 per 400ms" {
		t.Fatalf("second admission: %+v, want denied by 1 per 400ms", b)
	}
	if want := a.Now.Add(400 * time.Millisecond).Sub(b.Now); b.Delay != want {
		t.Errorf("delay = %s, want %s (a's entry leaving its window)", b.Delay, want)
	}

	time.Sleep(b.Delay) // the passage of time is under test: the delay is enough
	c := mustAdmit(t, l, Request{ID: "c", Takes: take})
	if !c.Allowed() {
		t.Fatalf("after the delay: %+v, want allowed", c)
	}
	// Now the long window binds: it frees when a's entry is 2s old.
	d := mustAdmit(t, l, Request{ID: "d", Takes: take})
	if d.Allowed() || d.Limit != "2 per 2s" {
		t.Fatalf("third admission: %+v, want denied by 2 per 2s", d)
	}
	if want := a.Now.Add(2 * time.Second).Sub(d.Now); d.Delay != want {
		t.Errorf("delay = %s, want %s", d.Delay, want)
	}
}

// TestQuotaMarginHoldsEachWindowLonger checks WithMargin: each window is
// held the margin longer, for a plain admission and for a booking, while the
// limits it reports are the windows as written.
func TestQuotaMarginHoldsEachWindowLonger(t *testing.T) {
	l, _ := newStandalone(t)
	const margin = 300 * time.Millisecond
	q, err := mustQuota(t, "mkt", Window{1, time.Second}, Window{2, 10 * time.Second}).WithMargin(margin)
	if err != nil {
		t.Fatal(err)
	}
	take := []Take{{Rule: q, Subject: "alice"}}
	a := mustAdmit(t, l, Request{ID: "a", Takes: take})
	if !a.Allowed() {
		t.Fatalf("first admission: %+v, want allowed", a)
	}
	b := mustAdmit(t, l, Request{ID: "b", Takes: take})
	if b.Allowed() || b.Limit != "1 per 1s" {
		t.Fatalf("second admission: %+v, want denied by 1 per 1s", b)
	}
	if want := a.Now.Add(time.Second + margin).Sub(b.Now); b.Delay != want {
		t.Errorf("delay = %s, want %s (a window and the margin after a)", b.Delay, want)
	}
	c := mustAdmit(t, l, Request{ID: "c", Takes: take, book: &Booking{}})
	if !c.Booked() || !c.At().Equal(a.Now.Add(time.Second+margin)) {
		t.Errorf("booking: %+v, want booked a window and the margin after a (%s)", c, a.Now.Add(time.Second+margin))
	}
	if q.String() != "1 per 1s, 2 per 10s" {
		t.Errorf("String() = %q, want the windows as written", q.String())
	}
	for _, bad := range []time.Duration{-time.Millisecond, time.Minute + 1} {
		if _, err := q.WithMargin(bad); !errors.Is(err, ErrInvalidRule) {
			t.Errorf("WithMargin(%s) = %v, want ErrInvalidRule", bad, err)
		}
	}
}

func TestBucketDelayIsUntilTheTokensAreThere(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		cost  int
	}{
		{"fractional rate", 0.2, 1, 1},
		{"fast, cost of a whole burst", 5000, 20, 20},
		{"cost above one", 10, 5, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := newStandalone(t)
			b := mustBucket(t, "sms", tc.rate, tc.burst)
			r := func(id string) Request {
				return Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw", Cost: tc.cost}}}
			}
			// The bucket's level, replayed from the decisions' Redis times: it
			// refills between takes (up to its burst: on a busy machine a
			// fast bucket can fill again between two takes).
			level, last := float64(tc.burst), time.Time{}
			n := 0
			for ; ; n++ {
				d := mustAdmit(t, l, r(fmt.Sprint("job-", n)))
				if !last.IsZero() {
					level = math.Min(float64(tc.burst), level+float64(d.Now.Sub(last).Microseconds())*tc.rate/1e6)
				}
				last = d.Now
				if d.Allowed() {
					level -= float64(tc.cost)
				}
				if !d.Allowed() {
					tokens := level
					want := time.Duration(math.Ceil((float64(tc.cost)-tokens)*1e6/tc.rate)) * time.Microsecond
					if diff := d.Delay - want; diff < -time.Microsecond || diff > time.Microsecond {
						t.Errorf("delay = %s, want %s", d.Delay, want)
					}
					break
				}
			}
			if n < tc.burst/tc.cost {
				t.Errorf("%d admitted before the first denial, want at least %d", n, tc.burst/tc.cost)
			}
		})
	}
}

func TestAdmissionIsAllOrNothing(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "mkt", Window{3, time.Hour})
	b := mustBucket(t, "sms", 0.001, 1)
	mustAdmit(t, l, Request{ID: "x", Takes: []Take{{Rule: b, Subject: "gw"}}})

	before := snapshot(t, rdb)
	d := mustAdmit(t, l, Request{ID: "y", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}}})
	if d.Allowed() || d.TakeIndex != 1 {
		t.Fatalf("%+v, want denied by the bucket", d)
	}
	if after := snapshot(t, rdb); !equalMaps(before, after) {
		t.Errorf("a denied admission changed Redis:\nbefore %v\nafter  %v", before, after)
	}
}

// TestDeniedByQuotaDoesNotReadTheLedger: once a recipient's quota denies
// and the provider's bucket has the tokens, the bucket's take passes either
// way and nothing is written, so its ledger is not read (the busiest path of
// a fleet: a recipient at its cap). The take then counts as not held, even
// by a task that holds it: Remaining is the tokens left after its cost.
func TestDeniedByQuotaDoesNotReadTheLedger(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "mkt", Window{3, time.Hour})
	b := mustBucket(t, "sms", 0.001, 3)
	both := func(id string) Request {
		return Request{ID: id, Takes: []Take{{Rule: q, Subject: "alice", Cost: 3}, {Rule: b, Subject: "gw"}}}
	}
	// "a" holds all 3 of the quota and a token; then it gives the quota
	// back (a release of that take alone) and "b" takes 1 of it.
	mustAdmit(t, l, both("a"))
	if n, err := l.Release(ctx, Request{ID: "a", Takes: both("a").Takes[:1]}); n != 1 || err != nil {
		t.Fatalf("release a's quota entry: %d, %v", n, err)
	}
	if d := mustAdmit(t, l, Request{ID: "b", Takes: []Take{{Rule: q, Subject: "alice"}}}); !d.Allowed() {
		t.Fatalf("b: %+v", d)
	}
	before := commandCalls(t, rdb)["zscore"]
	// The quota has 2 left of the 3 asked for; the bucket has 2 tokens and
	// "a" holds one more.
	for _, id := range []string{"a", "c"} {
		d := mustAdmit(t, l, both(id))
		if d.Allowed() || d.TakeIndex != 0 {
			t.Fatalf("%s: %+v, want denied by the quota", id, d)
		}
		if d.Remaining != 1 {
			t.Errorf("%s: remaining %d, want 1 (the bucket's 2 tokens less the take's cost)", id, d.Remaining)
		}
	}
	if n := commandCalls(t, rdb)["zscore"] - before; n != 0 {
		t.Errorf("denied admissions ran ZSCORE %d times, want 0: the ledger need not be read", n)
	}
}

// TestHeldSaysAnEarlierAdmissionTookIt: Held is set when some take already
// held the task's ID, whether or not the others consumed now; never for a
// first admission or a check.
func TestHeldSaysAnEarlierAdmissionTookIt(t *testing.T) {
	l, _ := newStandalone(t)
	q := mustQuota(t, "mkt", Window{3, time.Hour})
	b, b2 := mustBucket(t, "sms", 100, 5), mustBucket(t, "push", 100, 5)
	r := Request{ID: "job-1", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}}}
	other := Request{ID: "job-1", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b2, Subject: "gw"}}}
	check, err := l.Check(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		d       Decision
		held    bool
		outcome Outcome
	}{
		{"a check", check, false, Admitted},
		{"the first admission", mustAdmit(t, l, r), false, Admitted},
		{"the same again", mustAdmit(t, l, r), true, Repeated},
		{"the quota held, another bucket", mustAdmit(t, l, other), true, Admitted},
		{"another task", mustAdmit(t, l, Request{ID: "job-2", Takes: r.Takes}), false, Admitted},
	} {
		if c.d.Held != c.held || c.d.Outcome != c.outcome {
			t.Errorf("%s: held %t, %s; want held %t, %s", c.name, c.d.Held, c.d.Outcome, c.held, c.outcome)
		}
	}
}

func TestAdmissionIsIdempotentByTaskID(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "mkt", Window{1, time.Hour})
	b := mustBucket(t, "sms", 0.001, 5)
	r := Request{ID: "job-1", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw", Cost: 2}}}
	first := mustAdmit(t, l, r)
	before := snapshot(t, rdb)
	again := mustAdmit(t, l, r)
	if !first.Allowed() || first.Outcome == Repeated || !again.Allowed() || again.Outcome != Repeated {
		t.Fatalf("first %+v, again %+v: want allowed, then allowed and repeated", first, again)
	}
	if after := snapshot(t, rdb); !equalMaps(before, after) {
		t.Errorf("a repeated admission changed Redis: %v, was %v", after, before)
	}
	if tok := tokens(t, rdb, keyspace.Bucket(keyspace.Tag(DefaultPrefix, "gw"), "sms"), 0.001, 5); tok > 3.01 {
		t.Errorf("bucket tokens = %v, want 3: the repeat must not take again", tok)
	}
}

func TestReleaseGivesBackOnce(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "mkt", Window{1, time.Hour})
	b := mustBucket(t, "sms", 0.001, 1)
	now := redisNow(t, l)
	c := mustCalendarWindow(t, 1, now.Add(-time.Hour), now.Add(time.Hour))
	r := Request{ID: "job-1", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}, {Rule: c, Subject: "alice"}}}
	mustAdmit(t, l, r)
	if d := mustAdmit(t, l, Request{ID: "job-2", Takes: r.Takes}); d.Allowed() {
		t.Fatalf("job-2 admitted while job-1 holds every take")
	}
	for i, want := range []int{3, 0} {
		n, err := l.Release(ctx, r)
		if err != nil || n != want {
			t.Fatalf("release %d: %d, %v; want %d", i+1, n, err, want)
		}
	}
	// The slot came back: no span is left in the calendar (only the mark of
	// its life, which goes with it).
	if spans := rdb.ZCount(ctx, keyspace.Slots(keyspace.Tag(DefaultPrefix, "gw"), "sms"), "(0", "+inf").Val(); spans != 0 {
		t.Errorf("bucket calendar holds %d spans after its only slot came back", spans)
	}
	if d := mustAdmit(t, l, Request{ID: "job-2", Takes: r.Takes}); !d.Allowed() {
		t.Errorf("job-2 after job-1 was released: %+v, want allowed", d)
	}
	if n, err := l.Release(ctx, Request{ID: "never", Takes: r.Takes}); n != 0 || err != nil {
		t.Errorf("release of a task never admitted: %d, %v", n, err)
	}
}

func TestReservationPacesABucket(t *testing.T) {
	l, _ := newStandalone(t)
	b := mustBucket(t, "sms", 10, 1) // one token every 100ms
	q := mustQuota(t, "mkt", Window{5, time.Hour})
	take := func(id string) Request {
		return Request{ID: id, Takes: []Take{{Rule: q, Subject: id}, {Rule: b, Subject: "gw"}}}
	}
	var ds []Decision
	for _, id := range []string{"a", "b", "c"} {
		d, err := l.Admit(ctx, withWait(take(id), 250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	// a goes now, b and c get the next two tokens, 100ms apart.
	if !ds[0].Allowed() || ds[0].Delay != 0 {
		t.Fatalf("a: %+v, want allowed now", ds[0])
	}
	for i, d := range ds[1:] {
		if !d.Allowed() || d.TakeIndex != 1 {
			t.Fatalf("reservation %d: %+v, want allowed with a wait set by the bucket", i+2, d)
		}
	}
	// 100ms to the µs, but for the rounding up of each moment to a whole µs
	// after floating-point refills (the differential test checks that
	// arithmetic exactly): it failed now and then when required to be exact.
	if gap := ds[2].At().Sub(ds[1].At()); gap < 100*time.Millisecond-time.Microsecond || gap > 100*time.Millisecond+time.Microsecond {
		t.Errorf("reserved moments %s apart, want 100ms (±1µs of rounding)", gap)
	}
	again, _ := l.Admit(ctx, withWait(take("c"), 250*time.Millisecond))
	if again.Outcome != Repeated || !again.At().Equal(ds[2].At()) {
		t.Errorf("reserving c again: %+v, want the same moment %s", again, ds[2].At())
	}
	// Too far ahead for the max wait: denied, nothing reserved.
	if d, _ := l.Admit(ctx, withWait(take("d"), 250*time.Millisecond)); d.Allowed() {
		t.Errorf("d: %+v, want denied (a 300ms wait)", d)
	}
	// Cancelling c gives its token back, so d fits again.
	if n, _ := l.Release(ctx, take("c")); n != 2 {
		t.Errorf("cancel c released %d takes, want 2", n)
	}
	if d, _ := l.Admit(ctx, withWait(take("d"), 250*time.Millisecond)); !d.Allowed() {
		t.Errorf("d after c was cancelled: %+v, want allowed", d)
	}
}

func TestChangedLimitsApplyAtOnceAndKeepHistory(t *testing.T) {
	l, _ := newStandalone(t)
	one := mustQuota(t, "mkt", Window{1, time.Hour})
	three := mustQuota(t, "mkt", Window{3, time.Hour})
	mustAdmit(t, l, Request{ID: "a", Takes: []Take{{Rule: one, Subject: "alice"}}})
	if d := mustAdmit(t, l, Request{ID: "b", Takes: []Take{{Rule: one, Subject: "alice"}}}); d.Allowed() {
		t.Fatal("b admitted under 1 per hour")
	}
	d := mustAdmit(t, l, Request{ID: "b", Takes: []Take{{Rule: three, Subject: "alice"}}})
	if !d.Allowed() || d.Remaining != 1 {
		t.Errorf("b under 3 per hour: %+v, want allowed with 1 remaining (a still counts)", d)
	}
}

func TestEveryKeyExpires(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "mkt", Window{1, time.Hour}, Window{3, 7 * 24 * time.Hour})
	b := mustBucket(t, "sms", 0.5, 10)
	now := redisNow(t, l)
	c := mustCalendarWindow(t, 5, now.Add(-time.Hour), now.Add(time.Hour))
	mustAdmit(t, l, Request{ID: "a", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw", Cost: 4}, {Rule: c, Subject: "alice"}}})
	l.Sent(b, "gw", 4) // and a worker sent it
	stopped, stop := context.WithCancel(ctx)
	stop()
	l.CountSends(stopped)
	longest := map[string]time.Duration{
		":q:mkt":       7 * 24 * time.Hour,
		":b:sms:sent":  310 * time.Second,                                      // the sends of 30 bins of 10 s, and the one now
		":b:sms:slots": 8*time.Second + 100*time.Millisecond + DefaultRemember, // one slot of 4 tokens at 0.5/s, to the end of its 100 ms step, and its ledger entry remember more
		":c:cal":       time.Hour + time.Millisecond,                           // to the end of its window, an hour from now, and the ms a TTL is rounded up by
	}
	keys, _ := rdb.Keys(ctx, "*").Result()
	if len(keys) != len(longest) {
		t.Fatalf("keys %v, want one per suffix of %v", keys, longest)
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 {
			t.Errorf("%s: PTTL %s (%v): every key must expire", k, ttl, err)
			continue
		}
		for suffix, max := range longest {
			if strings.HasSuffix(k, suffix) && ttl > max+time.Millisecond {
				t.Errorf("%s: PTTL %s, want at most %s", k, ttl, max)
			}
		}
	}
}

func TestImpossibleRulesAreRejectedWhenBuilt(t *testing.T) {
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"limit 0", func() error { _, err := NewQuota("q", Window{0, time.Hour}); return err },
			"throttle: quota q: window 1 (0 per 1h): limit must be from 1 to 1000000000 (got 0): invalid rule"},
		{"window 0", func() error { _, err := NewQuota("q", Window{1, time.Hour}, Window{3, 0}); return err },
			"throttle: quota q: window 2 (3 per 0s): window must be from 1ms to 87600h (got 0s): invalid rule"},
		{"no windows", func() error { _, err := NewQuota("q"); return err },
			"throttle: quota q: needs at least one window: invalid rule"},
		{"too many windows", func() error { _, err := NewQuota("q", make([]Window, MaxWindows+1)...); return err },
			"throttle: quota q: 33 windows: at most 32: invalid rule"},
		{"negative rate", func() error { _, err := NewBucket("sms", -1, 5); return err },
			"throttle: bucket sms: rate must be from 1e-06 to 1e+09 tokens per second (got -1): invalid rule"},
		{"NaN rate", func() error { _, err := NewBucket("sms", math.NaN(), 5); return err },
			"throttle: bucket sms: rate must be from 1e-06 to 1e+09 tokens per second (got NaN): invalid rule"},
		{"burst 0", func() error { _, err := NewBucket("sms", 1, 0); return err },
			"throttle: bucket sms: burst must be from 1 to 1000000000 (got 0): invalid rule"},
		{"bad name", func() error { _, err := NewBucket("sms gateway", 1, 1); return err },
			`throttle: bucket name "sms gateway": must be 1-64 of A-Z a-z 0-9 _ . -: invalid rule`},
		{"slow bucket never fills", func() error { _, err := NewBucket("sms", 1e-6, 1000); return err },
			"throttle: bucket sms: burst 1000 at 1e-06/s takes longer than 87600h to fill: invalid rule"},
		{"cost above burst", func() error {
			b, _ := NewBucket("sms", 100, 20)
			return Request{ID: "a", Takes: []Take{{Rule: b, Subject: "gw", Cost: 21}}}.validate()
		}, `throttle: task "a": take 1: cost 21 exceeds what bucket sms (100/s burst 20) can ever admit (20): invalid rule`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil || err.Error() != tc.want {
				t.Errorf("got  %v\nwant %s", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidRule) {
				t.Errorf("%v does not wrap ErrInvalidRule", err)
			}
			// A constructor's error holds the rule's problem alone.
			var re *RuleError
			if ok := errors.As(err, &re); ok != (tc.name != "cost above burst") {
				t.Errorf("%v: errors.As *RuleError = %v", err, ok)
			} else if ok && "throttle: "+re.Error()+": invalid rule" != tc.want {
				t.Errorf("RuleError %q does not make %q", re, tc.want)
			}
		})
	}
}

func TestBadRequestsNeverReachRedis(t *testing.T) {
	b, _ := NewBucket("sms", 1, 1)
	tests := []struct {
		name string
		r    Request
		want string
	}{
		{"empty ID", Request{Takes: []Take{{Rule: b, Subject: "gw"}}}, "throttle: empty task ID: invalid request"},
		{"control character", Request{ID: "a\nb", Takes: []Take{{Rule: b, Subject: "gw"}}}, `throttle: task ID "a\nb": control character U+000A: invalid request`},
		{"no takes", Request{ID: "a"}, `throttle: task "a": no takes: invalid request`},
		{"too many takes", Request{ID: "a", Takes: make([]Take, MaxTakes+1)}, `throttle: task "a": 33 takes: at most 32: invalid request`},
		{"empty key", Request{ID: "a", Takes: []Take{{Rule: b}}}, `throttle: task "a": take 1 (sms): empty key: invalid request`},
		{"twice", Request{ID: "a", Takes: []Take{{Rule: b, Subject: "gw"}, {Rule: b, Subject: "gw"}}}, `throttle: task "a": take 2: sms for "gw" is taken twice: invalid request`},
		{"negative cost", Request{ID: "a", Takes: []Take{{Rule: b, Subject: "gw", Cost: -1}}}, `throttle: task "a": take 1 (sms): cost must be at least 1 (got -1): invalid request`},
		{"long ID", Request{ID: strings.Repeat("x", MaxIDLen+1), Takes: []Take{{Rule: b, Subject: "gw"}}}, "throttle: task ID of 257 bytes: longer than 256: invalid request"},
	}
	l := &Limiter{} // no Redis at all: validation must come first
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.Admit(ctx, tc.r)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestPauseDrainsABucketForEveryone(t *testing.T) {
	l, rdb := newStandalone(t)
	other := mustLimiter(t, rdb) // another worker on the same Redis
	b := mustBucket(t, "sms", 100, 20)
	until, err := l.Pause(ctx, b, "gw", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if until < 1990*time.Millisecond || until > 2*time.Second {
		t.Errorf("next token in %s, want 2s", until)
	}
	d := mustAdmit(t, other, Request{ID: "a", Takes: []Take{{Rule: b, Subject: "gw"}}})
	if d.Allowed() || d.Delay < 1900*time.Millisecond || d.Delay > 2*time.Second {
		t.Errorf("admission during the pause: %+v, want denied for about 2s", d)
	}
}

// rememberASecond returns a limiter that keeps takes a second
// (MinRemember), on a database of its own, and take, which admits a task on
// bucket b for subject "gw" and fails the test unless it is allowed.
func rememberASecond(t *testing.T, b *Bucket) (*Limiter, *redis.Client, func(id string) Decision) {
	t.Helper()
	rdb, _ := shared.NewClient(t)
	l, err := New(rdb, Options{Remember: MinRemember})
	if err != nil {
		t.Fatal(err)
	}
	return l, rdb, func(id string) Decision {
		t.Helper()
		d := mustAdmit(t, l, Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}})
		if !d.Allowed() {
			t.Fatalf("%s: %+v", id, d)
		}
		return d
	}
}

// TestLedgerPrunedAStepAtATime: on a bucket faster than STEP_PRUNE_RATE
// (100/s), a plain take that starts a new 100 ms step of the calendar's life
// drops the ledger's entries whose slots ended Remember ago, rather than
// leaving them all to the first take of the next 10 s bin, whose one call
// stalled Redis for 130-210 ms at 60,000 takes a second. A slower bucket
// leaves them to the bin's take (a step's prune would cost it a command
// every other take at 20/s). Everything happens inside one 10 s bin, so
// that the bin's prune plays no part. (It waits for Redis's clock between
// takes: the passage of time under test.)
func TestLedgerPrunedAStepAtATime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate   float64
		pruned bool
	}{{1000, true}, {50, false}} {
		t.Run(fmt.Sprintf("%g/s", tc.rate), func(t *testing.T) {
			t.Parallel()
			ledgerStepPrune(t, tc.rate, tc.pruned)
		})
	}
}

// ledgerStepPrune runs TestLedgerPrunedAStepAtATime on a bucket of rate
// (burst 1000): 20 takes, then one every 400 ms; pruned says whether the
// first 20 must be gone from the ledger after 1.6 s, or all still there.
func ledgerStepPrune(t *testing.T, rate float64, pruned bool) {
	l, rdb, take := rememberASecond(t, mustBucket(t, "sms", rate, 1000))
	tag := keyspace.Tag(DefaultPrefix, "gw")
	const bin = 10 * time.Second
	for try := 1; ; try++ {
		// Start early in a bin: the run takes about 1.6 s.
		if now, err := rdb.Time(ctx).Result(); err != nil {
			t.Fatal(err)
		} else if now.Sub(now.Truncate(bin)) > 6*time.Second {
			untilRedis(t, l, now.Truncate(bin).Add(bin+10*time.Millisecond))
		}
		first := take(fmt.Sprint("a0-", try))
		for i := 1; i < 20; i++ {
			take(fmt.Sprintf("a%d-%d", i, try))
		}
		// Takes 400 ms apart keep the ledger alive (each extends it to its
		// slot's end and Remember), each the first of its step.
		var last Decision
		for i := 1; i <= 4; i++ {
			untilRedis(t, l, first.At().Add(time.Duration(i)*400*time.Millisecond))
			last = take(fmt.Sprintf("c%d-%d", i, try))
		}
		if last.At().Truncate(bin) != first.At().Truncate(bin) {
			if try == 3 {
				t.Fatalf("three runs crossed a 10 s bin (a busy machine?): the step's prune went unchecked")
			}
			t.Logf("run %d crossed a 10 s bin: again", try)
			continue
		}
		got := ledgerIDs(t, rdb, tag, "sms")
		kept := 0
		for _, m := range got {
			if strings.HasPrefix(m, "a") {
				kept++
			}
		}
		after := last.At().Sub(first.At()).Round(time.Millisecond)
		switch {
		case pruned && kept > 0:
			t.Errorf("ledger holds %d of the first 20 takes %s after them, want them pruned (Remember 1s): %q", kept, after, got)
		case !pruned && kept != 20:
			t.Errorf("ledger holds %d of the first 20 takes %s after them, want all 20 until the bin's prune: %q", kept, after, got)
		}
		if !slices.Contains(got, fmt.Sprint("c4-", try)) {
			t.Errorf("ledger %q lacks the last take", got)
		}
		return
	}
}

// TestLedgerKeepsSlotsUntilTheyEnd: the ledger's pruning drops an entry
// Remember after its slot ended, not after it started: takes of 800 tokens
// at 200/s hold slots of 4 s (Remember 1 s), and a task whose slot is
// still running when a later take prunes still holds it, so its retake
// takes nothing more. (It waits 2 s of Redis's clock: the passage of time
// under test.)
func TestLedgerKeepsSlotsUntilTheyEnd(t *testing.T) {
	t.Parallel()
	b := mustBucket(t, "sms", 200, 1000) // over STEP_PRUNE_RATE: each step prunes
	l, _, _ := rememberASecond(t, b)
	req := func(id string, maxWait time.Duration) Request {
		return Request{ID: id, MaxWait: maxWait, Takes: []Take{{Rule: b, Subject: "gw", Cost: 800}}}
	}
	a := mustAdmit(t, l, req("a", 0))
	if !a.Allowed() {
		t.Fatalf("a: %+v", a)
	}
	untilRedis(t, l, a.At().Add(2*time.Second))
	// b's slot follows a's: its take starts a new step of the calendar's
	// life, which prunes the ledger.
	if d := mustAdmit(t, l, req("b", 3*time.Second)); !d.Allowed() || d.Delay <= 0 {
		t.Fatalf("b: %+v, want a reservation after a's slot", d)
	}
	if d := mustAdmit(t, l, req("a", 0)); !d.Allowed() || d.Outcome != Repeated {
		t.Errorf("a again, 2 s into its 4 s slot: %+v; want allowed and repeated (the ledger still holds it)", d)
	}
}

// TestLedgerFollowsSlotsInFlight: a bucket's ledger holds the tasks whose
// slots have not ended (and Remember more), not every take of the last
// minutes: the first take of each 10 s bin prunes the rest, and the ledger
// lives only until its last slot has ended and Remember more. (It waits for
// Redis's clock to enter the next bin: the passage of time under test.)
func TestLedgerFollowsSlotsInFlight(t *testing.T) {
	t.Parallel()
	b := mustBucket(t, "sms", 1000, 100)
	l, rdb, take := rememberASecond(t, b)
	tag := keyspace.Tag(DefaultPrefix, "gw")
	var last Decision
	for i := range 50 {
		last = take(fmt.Sprint("a", i))
	}
	if n := len(ledger(t, rdb, tag, "sms")); n != 50 {
		t.Fatalf("ledger holds %d, want the 50 taken", n)
	}
	if ttl := rdb.PTTL(ctx, keyspace.Slots(tag, "sms")).Val(); ttl > 1300*time.Millisecond {
		t.Errorf("the calendar (and ledger) PTTL %s after 50 takes of 1ms slots, want about Remember (1s) and a step", ttl)
	}
	// The next 10 s bin, at least Remember after the slots ended.
	const bin = 10 * time.Second
	next := last.At().Add(time.Second).Truncate(bin).Add(bin)
	untilRedis(t, l, next.Add(time.Millisecond))
	// b takes the whole burst: its slot, and with it the calendar (which
	// lives until its last span ends), lasts 100 ms rather than 1 ms, long
	// enough to be read after the take on a busy machine.
	if d := mustAdmit(t, l, Request{ID: "b", Takes: []Take{{Rule: b, Subject: "gw", Cost: 100}}}); !d.Allowed() {
		t.Fatalf("b: %+v", d)
	}
	// Both keys end on their own soon after (the ledger Remember after b's
	// slot): a machine that stalls that long between the take and the
	// reads finds them gone, which checks nothing but is no failure.
	switch got := ledgerIDs(t, rdb, tag, "sms"); {
	case len(got) == 0:
		t.Logf("the ledger ended Remember after b's slot before it was read: its pruning went unchecked")
	case !slices.Equal(got, []string{"b"}):
		t.Errorf("ledger in the next bin holds %q, want [b]", got)
	}
	switch n := rdb.ZCount(ctx, keyspace.Slots(tag, "sms"), "(0", "+inf").Val(); { // spans, not the marks of the calendar's life
	case n > 1:
		t.Errorf("calendar holds %d spans, want b's alone: the ended ones are pruned", n)
	case n == 0:
		t.Logf("the calendar ended with b's slot before it was read: its pruning went unchecked")
	}
}
