package throttle

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// redisNow returns Redis's clock, which decides.
func redisNow(t *testing.T, l *Limiter) time.Time {
	t.Helper()
	now, err := l.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.Truncate(time.Microsecond)
}

func mustQuiet(t *testing.T, from, until time.Time, spans ...Span) *Quiet {
	t.Helper()
	q, err := NewQuiet("quiet", from, until, spans...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func mustCalendarWindow(t *testing.T, limit int, bounds ...time.Time) *CalendarWindow {
	t.Helper()
	c, err := NewCalendarWindow("cal", limit, bounds...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestQuietDeniesUntilTheSpanEnds(t *testing.T) {
	l, _ := newStandalone(t)
	now := redisNow(t, l)
	end := now.Add(400 * time.Millisecond)
	q := mustQuiet(t, now.Add(-time.Hour), now.Add(time.Hour), Span{now.Add(-time.Minute), end})
	quota := mustQuota(t, "m", Window{5, time.Hour})
	r := Request{ID: "a", Takes: []Take{{Rule: quota, Subject: "alice"}, {Rule: q, Subject: "alice"}}}
	d := mustAdmit(t, l, r)
	if d.Allowed() || d.Rule != Rule(q) || d.Limit != "quiet hours" || !d.At().Equal(end) {
		t.Fatalf("inside quiet hours: %+v; want denied by the quiet hours until %s", d, end)
	}
	untilRedis(t, l, end)
	if d := mustAdmit(t, l, r); !d.Allowed() {
		t.Fatalf("after the span: %+v", d)
	}
	if d := mustAdmit(t, l, r); !d.Allowed() || d.Outcome != Repeated {
		t.Fatalf("again: %+v; want allowed, repeated (quiet hours hold nothing)", d)
	}
}

func TestQuietMeetsTheMaxWait(t *testing.T) {
	l, _ := newStandalone(t)
	now := redisNow(t, l)
	start, end := now.Add(time.Second), now.Add(2*time.Second)
	q := mustQuiet(t, now.Add(-time.Hour), now.Add(time.Hour), Span{start, end})
	r := Request{ID: "a", Takes: []Take{{Rule: q, Subject: "alice"}}}
	if d := mustAdmit(t, l, r); !d.Allowed() {
		t.Fatalf("a second before quiet hours, no wait: %+v", d)
	}
	r.ID, r.MaxWait = "b", 1500*time.Millisecond // could be stamped inside
	if d := mustAdmit(t, l, r); d.Allowed() || !d.At().Equal(end) {
		t.Fatalf("with a max wait reaching into quiet hours: %+v; want denied until %s", d, end)
	}
}

func TestQuietOutsideItsCoverFails(t *testing.T) {
	l, _ := newStandalone(t)
	now := redisNow(t, l)
	q := mustQuiet(t, now.Add(time.Hour), now.Add(2*time.Hour))
	_, err := l.Admit(context.Background(), Request{ID: "a", Takes: []Take{{Rule: q, Subject: "alice"}}})
	if err == nil || !strings.Contains(err.Error(), "quiet hours do not cover Redis time") {
		t.Fatalf("got %v; want an error saying the cover does not hold Redis time", err)
	}
}

func TestCalendarWindowCounts(t *testing.T) {
	l, rdb := newStandalone(t)
	now := redisNow(t, l)
	next := now.Add(400 * time.Millisecond)
	c := mustCalendarWindow(t, 2, now.Add(-time.Hour), next, now.Add(time.Hour))
	req := func(id string) Request { return Request{ID: id, Takes: []Take{{Rule: c, Subject: "alice"}}} }
	for _, id := range []string{"a", "b"} {
		if d := mustAdmit(t, l, req(id)); !d.Allowed() {
			t.Fatalf("%s: %+v", id, d)
		}
	}
	if d := mustAdmit(t, l, req("a")); !d.Allowed() || d.Outcome != Repeated {
		t.Fatalf("a again: %+v; want repeated", d)
	}
	before := snapshot(t, rdb)
	d := mustAdmit(t, l, req("c"))
	if d.Allowed() || !d.At().Equal(next) || d.Rule != Rule(c) {
		t.Fatalf("third in the window: %+v; want denied until the next window (%s)", d, next)
	}
	if after := snapshot(t, rdb); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a denial wrote: %v -> %v", before, after)
	}
	untilRedis(t, l, next)
	if d := mustAdmit(t, l, req("c")); !d.Allowed() {
		t.Fatalf("in the next window: %+v", d)
	}
	if n, err := l.Release(context.Background(), req("c")); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	if n, _ := rdb.ZCard(context.Background(), "throttle:{alice}:c:cal").Result(); n != 0 {
		t.Fatalf("%d entries left after the new window's commit and a release: want the old window's pruned", n)
	}
}

// TestBookQuietMorningInOrder: messages for many recipients held by quiet
// hours book the end of the span in order: the provider's burst at once,
// then one slot apart.
func TestBookQuietMorningInOrder(t *testing.T) {
	l, _ := newStandalone(t)
	now := redisNow(t, l)
	end := now.Add(time.Second)
	q := mustQuiet(t, now.Add(-time.Hour), now.Add(time.Hour), Span{now.Add(-time.Hour), end})
	b := mustBucket(t, "sms", 10, 5) // a slot every 100ms
	quota := mustQuota(t, "m", Window{1, time.Hour})
	for i := range 8 {
		rcpt := fmt.Sprint("r", i)
		r := Request{ID: fmt.Sprint("t", i), book: &Booking{}, MaxWait: 150 * time.Millisecond, Takes: []Take{
			{Rule: quota, Subject: rcpt}, {Rule: q, Subject: rcpt}, {Rule: b, Subject: "gw"}}}
		d := mustAdmit(t, l, r)
		want, by := end, Rule(q)
		if i >= 5 { // past the burst: a slot each
			want, by = end.Add(time.Duration(i-4)*100*time.Millisecond), b
		}
		if !d.Booked() || !d.At().Equal(want) || d.Rule != by {
			t.Fatalf("t%d: %+v; want booked by %s at %s", i, d, by, want)
		}
	}
	// The claims: each goes at its moment.
	for i := range 8 {
		r := Request{ID: fmt.Sprint("t", i), book: &Booking{}, MaxWait: 150 * time.Millisecond, Takes: []Take{
			{Rule: quota, Subject: fmt.Sprint("r", i)}, {Rule: q, Subject: fmt.Sprint("r", i)}, {Rule: b, Subject: "gw"}}}
		untilRedis(t, l, end.Add(time.Duration(i)*100*time.Millisecond-100*time.Millisecond))
		d := mustAdmit(t, l, r)
		slot := end.Add(time.Duration(i) * 100 * time.Millisecond) // its slot's start
		if d.Now.After(slot) {
			// A busy machine made the claim late: it books again (a test of
			// its own), and the order of the others still holds.
			continue
		}
		if !d.Allowed() || d.At().Before(end) || d.At().After(slot) {
			t.Fatalf("claim t%d: %+v; want allowed from %s, by its slot %s", i, d, end, slot)
		}
	}
}

// TestBookCalendarNextWindow: a recipient over its calendar limit books the
// next window's start; a booking past the bounds the plan holds is not made.
func TestBookCalendarNextWindow(t *testing.T) {
	l, _ := newStandalone(t)
	now := redisNow(t, l)
	next, last := now.Add(time.Minute), now.Add(2*time.Minute)
	c := mustCalendarWindow(t, 1, now.Add(-time.Hour), next, last)
	b := mustBucket(t, "sms", 10, 5)
	req := func(id string) Request {
		return Request{ID: id, book: &Booking{}, MaxWait: 100 * time.Millisecond, Takes: []Take{{Rule: c, Subject: "alice"}, {Rule: b, Subject: "gw"}}}
	}
	if d := mustAdmit(t, l, req("a")); !d.Allowed() {
		t.Fatalf("a: %+v", d)
	}
	if d := mustAdmit(t, l, req("b")); !d.Booked() || !d.At().Equal(next) || d.Rule != Rule(c) {
		t.Fatalf("b: %+v; want booked at the next window's start %s", d, next)
	}
	if d := mustAdmit(t, l, req("b")); !d.Booked() || !d.At().Equal(next) {
		t.Fatalf("b again: %+v; want its moment", d)
	}
	if d := mustAdmit(t, l, req("c")); d.Booked() || d.Allowed() || !d.At().Equal(last) {
		t.Fatalf("c: %+v; want not booked, asked back at the end of the bounds %s", d, last)
	}
}
