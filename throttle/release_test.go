package throttle

import (
	"slices"
	"testing"
	"time"
)

// bucketBound fails t if the moments (any order) put more than
// burst + rate·T grants in some interval of length T. Moments are rounded
// up to whole µs after float refills, hence the slack of a few µs of rate.
func bucketBound(t *testing.T, moments []time.Time, rate float64, burst int) {
	t.Helper()
	s := slices.Clone(moments)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	for i := range s {
		for j := i; j < len(s); j++ {
			span := s[j].Sub(s[i])
			allowed := float64(burst) + rate*(span+5*time.Microsecond).Seconds()
			if n := float64(j - i + 1); n > allowed {
				t.Errorf("%d grants within %s (from +%s): the bucket allows %.3f", j-i+1, span, s[i].Sub(s[0]), allowed)
			}
		}
	}
}

// TestReleaseFreesItsSlot: reservations A, B, C, D of a 10/s burst-1
// bucket hold slots 100ms apart; releasing B frees exactly B's slot: the
// next reservation, E, takes it (before D's), and the grants still keep the
// bucket's bound. Releasing the latest (E) frees its slot for F.
func TestReleaseFreesItsSlot(t *testing.T) {
	l, _ := newStandalone(t)
	const rate, burst = 10, 1
	b := mustBucket(t, "sms", rate, burst)
	req := func(id string) Request { return Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}} }
	held := map[string]time.Time{}
	reserve := func(id string) Decision {
		t.Helper()
		d, err := l.Admit(ctx, withWait(req(id), 2*time.Second))
		if err != nil || !d.Allowed() {
			t.Fatalf("reserve %s: %+v, %v", id, d, err)
		}
		held[id] = d.At()
		return d
	}
	granted := func() []time.Time {
		var s []time.Time
		for _, m := range held {
			s = append(s, m)
		}
		return s
	}
	for _, id := range []string{"A", "B", "C", "D"} {
		reserve(id)
	}
	bAt := held["B"]
	if n, err := l.Release(ctx, req("B")); n != 1 || err != nil {
		t.Fatalf("release B: %d, %v", n, err)
	}
	delete(held, "B")
	if e := reserve("E"); e.At().Sub(bAt).Abs() > time.Microsecond {
		t.Errorf("E reserved %s after B was released, want B's slot %s", e.At(), bAt)
	}
	bucketBound(t, granted(), rate, burst)

	eAt := held["E"]
	if n, err := l.Release(ctx, req("E")); n != 1 || err != nil {
		t.Fatalf("release E: %d, %v", n, err)
	}
	delete(held, "E")
	if f := reserve("F"); f.At().Sub(eAt).Abs() > time.Microsecond {
		t.Errorf("F reserved %s after E was released: want E's slot %s", f.At(), eAt)
	}
	bucketBound(t, granted(), rate, burst)
}

// TestForgetTakesAnotherTokenOnRetry: a send the provider took but failed
// is forgotten (its bucket holding dropped, nothing refunded), so that the
// retry of the same task takes a token of its own instead of passing as
// already admitted; the quota is left alone.
func TestForgetTakesAnotherTokenOnRetry(t *testing.T) {
	l, _ := newStandalone(t)
	b := mustBucket(t, "sms", 0.001, 2)
	q := mustQuota(t, "mkt", Window{5, time.Hour})
	r := Request{ID: "job-1", Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}}}
	mustAdmit(t, l, r)
	n, err := l.Forget(ctx, r)
	if err != nil || n != 1 {
		t.Fatalf("forget: %d, %v; want 1 bucket take", n, err)
	}
	if n, _ := l.Forget(ctx, r); n != 0 {
		t.Errorf("forget again: %d, want 0", n)
	}
	// The retry: the quota entry is still the task's, the bucket takes anew.
	d := mustAdmit(t, l, r)
	if !d.Allowed() || d.Outcome == Repeated || d.Remaining != 0 {
		t.Fatalf("retry after forget: %+v, want allowed, not repeated, the bucket's last token taken", d)
	}
	// Both tokens are gone: forget refunded nothing.
	if d := mustAdmit(t, l, Request{ID: "job-2", Takes: []Take{{Rule: b, Subject: "gw"}}}); d.Allowed() {
		t.Errorf("job-2 admitted by a bucket of burst 2 after two sends: forget refunded a token")
	}
	// The quota entry was not forgotten: release gives it back (and the token).
	if n, _ := l.Release(ctx, r); n != 2 {
		t.Errorf("release after the retry: %d takes, want 2", n)
	}
}

// TestReleaseAfterItsSlotGivesNothing: a take whose slot has ended holds
// nothing any more: releasing it gives nothing back (a slot in the past
// cannot be used), so the takes made since keep the bucket's bound. (The
// sleep is the passage of time under test: A's slot, 50 ms, must end.)
func TestReleaseAfterItsSlotGivesNothing(t *testing.T) {
	l, _ := newStandalone(t)
	const rate, burst = 20, 2
	b := mustBucket(t, "sms", rate, burst)
	req := func(id string) Request { return Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}} }
	if d := mustAdmit(t, l, req("A")); !d.Allowed() || d.Delay != 0 {
		t.Fatalf("A: %+v, want allowed now", d)
	}
	time.Sleep(3 * time.Second / rate) // time under test: A's slot ends
	var moments []time.Time
	for _, id := range []string{"B", "C"} {
		d := mustAdmit(t, l, req(id))
		if !d.Allowed() || d.Delay != 0 {
			t.Fatalf("%s: %+v, want allowed now", id, d)
		}
		moments = append(moments, d.At())
	}
	if n, err := l.Release(ctx, req("A")); n != 0 || err != nil {
		t.Fatalf("release A after its slot: %d, %v; want 0", n, err)
	}
	d, err := l.Admit(ctx, withWait(req("D"), time.Second))
	if err != nil || !d.Allowed() {
		t.Fatalf("reserve D: %+v, %v", d, err)
	}
	if d.Delay == 0 {
		t.Errorf("D admitted at once after B and C emptied the bucket")
	}
	bucketBound(t, append(moments, d.At()), rate, burst)
}

// TestForgottenTakeStillBlocksRefund: a forgotten holding (the provider took
// the token) keeps its slot busy, so releasing an earlier holding gives back
// that one's slot only, never the forgotten one's.
func TestForgottenTakeStillBlocksRefund(t *testing.T) {
	l, _ := newStandalone(t)
	const rate, burst = 10, 1
	b := mustBucket(t, "sms", rate, burst)
	req := func(id string) Request { return Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}} }
	reserve := func(id string) Decision {
		t.Helper()
		d, err := l.Admit(ctx, withWait(req(id), 2*time.Second))
		if err != nil || !d.Allowed() {
			t.Fatalf("reserve %s: %+v, %v", id, d, err)
		}
		return d
	}
	reserve("A")
	bd := reserve("B")
	if n, err := l.Forget(ctx, req("B")); n != 1 || err != nil {
		t.Fatalf("forget B: %d, %v", n, err)
	}
	if n, err := l.Release(ctx, req("A")); n != 1 || err != nil {
		t.Fatalf("release A: %d, %v", n, err)
	}
	c := reserve("C")
	bucketBound(t, []time.Time{bd.At(), c.At()}, rate, burst)
}

// TestPauseBlocksRefund: a slot a pause covers is not freed by a release
// made during it: the freed slot would be due before the provider's
// Retry-After.
func TestPauseBlocksRefund(t *testing.T) {
	l, _ := newStandalone(t)
	b := mustBucket(t, "sms", 10, 1)
	req := func(id string) Request { return Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}} }
	mustAdmit(t, l, req("A"))
	const pause = 2 * time.Second
	if _, err := l.Pause(ctx, b, "gw", pause); err != nil {
		t.Fatal(err)
	}
	if n, err := l.Release(ctx, req("A")); n != 1 || err != nil {
		t.Fatalf("release A: %d, %v", n, err)
	}
	d, err := l.Admit(ctx, withWait(req("C"), 10*time.Second))
	if err != nil || !d.Allowed() {
		t.Fatalf("reserve C: %+v, %v", d, err)
	}
	if d.Delay < pause-100*time.Millisecond {
		t.Errorf("C reserved %s ahead during a %s pause: the release refunded a token the pause drained", d.Delay, pause)
	}
}
