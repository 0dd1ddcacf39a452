package throttle

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// scale is a moment t scaled around now by k, as Repace scales the moments
// it holds: moments up to now stay.
func scale(t, now time.Time, k float64) time.Time {
	if !t.After(now) {
		return t
	}
	return now.Add(time.Duration(math.Ceil(float64(t.Sub(now)) * k)))
}

// TestRepaceMovesWaitingWorkToANewRate books a line on a slow bucket, then
// raises its rate: the line is scaled to the new pace (a task that booked
// the last slot claims it at once, a new task books right behind the
// scaled line), a second call changes nothing, and lowering it again takes
// from a task that claimed a slot ahead its slot. The calendar's spans
// never overlap.
func TestRepaceMovesWaitingWorkToANewRate(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	slow, fast := mustBucket(t, "sms", 2, 1), mustBucket(t, "sms", 20, 1)
	if k, _, err := l.Repace(ctx, slow, "gw"); err != nil || k != 0 {
		t.Fatalf("first Repace = %v, %v; want 0 (the rate recorded, nothing scaled)", k, err)
	}
	var last Decision
	for i := range 10 {
		last = mustAdmit(t, l, bookReq("m"+strconv.Itoa(i), nil, "", slow, 0))
	}
	if !last.Booked() || last.Delay < 4*time.Second {
		t.Fatalf("m9 on a 2/s bucket: %+v, want booked about 4.5 s ahead", last)
	}
	k, now, err := l.Repace(ctx, fast, "gw")
	if err != nil || k != 0.1 {
		t.Fatalf("Repace to 20/s = %v, %v; want k 0.1", k, err)
	}
	checkSpans(t, l, rdb, fast)
	want := scale(last.At(), now, k)
	back := mustAdmit(t, l, bookReq("m9", nil, "", fast, 0))
	if !back.Allowed() || back.At().Sub(want).Abs() > time.Millisecond {
		t.Fatalf("m9 back after the raise: %+v, want allowed at its scaled moment %s (was %s)", back, want, last.At())
	}
	next := mustAdmit(t, l, bookReq("m10", nil, "", fast, 0))
	if !next.Booked() || next.At().After(now.Add(time.Second)) {
		t.Errorf("m10 after the raise: %+v, want booked behind the scaled line, within a second", next)
	}
	if k, _, err := l.Repace(ctx, fast, "gw"); err != nil || k != 0 {
		t.Errorf("Repace at the same rate again = %v, %v; want 0", k, err)
	}
	// m9 claimed a slot ahead and sleeps until it: lowering the rate takes
	// it, and m9 finds out before it sends.
	if held, err := l.HasSlot(ctx, bookReq("m9", nil, "", fast, 0)); err != nil || !held {
		t.Fatalf("HasSlot(m9) before lowering = %v, %v; want true", held, err)
	}
	if k, _, err := l.Repace(ctx, slow, "gw"); err != nil || k != 10 {
		t.Fatalf("Repace to 2/s = %v, %v; want k 10", k, err)
	}
	checkSpans(t, l, rdb, slow)
	if held, err := l.HasSlot(ctx, bookReq("m9", nil, "", slow, 0)); err != nil || held {
		t.Errorf("HasSlot(m9) after lowering = %v, %v; want false: its slot ahead was taken", held, err)
	}
}

// checkSpans fails if two of b's calendar spans (for subject "gw")
// overlap.
func checkSpans(t *testing.T, l *Limiter, rdb *redis.Client, b *Bucket) {
	t.Helper()
	z, err := rdb.ZRangeWithScores(context.Background(), keyspace.Slots(keyspace.Tag(l.prefix, "gw"), b.Name()), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	type span struct{ from, to int64 }
	var spans []span
	for _, e := range z {
		m := e.Member.(string)
		if strings.HasPrefix(m, "-") || strings.HasPrefix(m, modelLedger) {
			continue // a mark of the calendar's life, or a ledger entry (rules.lua)
		}
		from, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			t.Fatalf("span %q: %v", m, err)
		}
		spans = append(spans, span{from, int64(e.Score)})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	for i := 1; i < len(spans); i++ {
		if spans[i].from < spans[i-1].to {
			t.Errorf("spans %v and %v overlap", spans[i-1], spans[i])
		}
	}
}

// TestRepaceScalesTheLine: a tenant's line is scaled with the rest (its
// caller scales the wake-ups of the tasks in it by the same k, so that each
// comes back at its place at the new pace): a task new to the line joins
// its end, a slot of the new rate after the last place, scaled.
func TestRepaceScalesTheLine(t *testing.T) {
	l, _ := newStandalone(t)
	ctx := context.Background()
	slow, fast := mustBucket(t, "sms", 2, 1), mustBucket(t, "sms", 20, 1)
	if _, _, err := l.Repace(ctx, slow, "gw"); err != nil {
		t.Fatal(err)
	}
	const ahead = time.Second
	var placed []Decision
	for i := range 12 {
		id := "m" + strconv.Itoa(i)
		if d := mustAdmit(t, l, lineReq(id, "", 1, slow, ahead)); d.Outcome == Placed {
			placed = append(placed, d)
		}
	}
	if len(placed) < 5 {
		t.Fatalf("%d of 12 placed in line at 2/s with a 1 s horizon", len(placed))
	}
	k, now, err := l.Repace(ctx, fast, "gw")
	if err != nil || k != 0.1 {
		t.Fatalf("Repace to 20/s = %v, %v; want k 0.1", k, err)
	}
	last := scale(placed[len(placed)-1].At(), now, k)
	next := mustAdmit(t, l, lineReq("new", "", 1, fast, ahead))
	if next.Outcome == Placed && (next.At().Sub(last)-50*time.Millisecond).Abs() > time.Microsecond {
		t.Errorf("a new task placed %s after the last scaled place, want one slot at 20/s (50ms)", next.At().Sub(last))
	}
}

// TestRepaceFreesClaimedSlots lowers the rate of a bucket whose slots ahead
// are claimed by tasks sleeping until them. Every slot ahead is taken from
// its task (which finds out before it sends); those of the tasks surely
// still asleep (their slots start past the old slack and BUMP_MARGIN) are
// freed, so that a task admitted after the change goes at the new rate
// instead of behind the old slots, scaled, while the provider idles
// through them; each of those tasks, admitted again as back from its place
// (it waited its turn), takes the first free slot. A slot nearer than that
// stays busy (its task may be sending), scaled.
func TestRepaceFreesClaimedSlots(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	fast, slow := mustBucket(t, "sms", 20, 1), mustBucket(t, "sms", 5, 1)
	if _, _, err := l.Repace(ctx, fast, "gw"); err != nil {
		t.Fatal(err)
	}
	var ds []Decision
	for i := range 40 {
		ds = append(ds, mustAdmit(t, l, bookReq("c"+strconv.Itoa(i), nil, "", fast, 2500*time.Millisecond)))
		if !ds[i].Allowed() {
			t.Fatalf("c%d at 20/s within 2.5 s: %+v, want admitted to sleep until its slot", i, ds[i])
		}
	}
	k, now, err := l.Repace(ctx, slow, "gw")
	if err != nil || k != 4 {
		t.Fatalf("Repace to 5/s = %v, %v; want k 4", k, err)
	}
	checkSpans(t, l, rdb, slow)
	busy := 0 // slots taken but not freed
	for i, d := range ds {
		id := "c" + strconv.Itoa(i)
		held, err := l.HasSlot(ctx, bookReq(id, nil, "", slow, 0))
		if err != nil {
			t.Fatal(err)
		}
		if ahead := d.At().After(now); held == ahead {
			t.Errorf("%s (slot %s after the change): HasSlot %v, want %v", id, d.At().Sub(now), held, !ahead)
		}
		if asleep := d.At().Sub(now) > modelBumpMargin*time.Microsecond; !asleep && !held {
			busy++
		}
	}
	// A task new after the change takes the first free slot: right after
	// the slots left busy (scaled too: slots of the new rate, 200ms each),
	// not after the 40 slots scaled 4x (8 s).
	next := mustAdmit(t, l, bookReq("new", nil, "", slow, 0))
	bound := now.Add(time.Duration(busy+2) * 200 * time.Millisecond)
	if next.At().After(bound) {
		t.Errorf("a task after the change goes at %s, want by %s (%d slots left busy): the freed slots still hold it back",
			next.At().Sub(now), bound.Sub(now), busy)
	}
}

// TestRepaceOfAnIdleBucketExpires: a worker re-paces every provider at
// start; on a provider that has no state (idle, or new) that records its
// rate in a state hash of the call's own, which must expire like every key
// the engine writes, not stay for good (a provider dropped from the config
// would leave it behind).
func TestRepaceOfAnIdleBucketExpires(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	b := mustBucket(t, "sms", 2, 1)
	if _, _, err := l.Repace(ctx, b, "gw"); err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.PTTL(ctx, keyspace.Bucket(keyspace.Tag(l.prefix, "gw"), b.Name())).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 {
		t.Errorf("the state hash a first Repace wrote has PTTL %s, want a life", ttl)
	}
}

// A task whose ticket a lowered rate moved later claims it, its quota
// entry moving with it, also under a quota too large to read (limit over
// QREAD) while the quota is far from its limit. Before, such a claim could
// not check the move, gave everything back and joined its line's end.
func TestRepaceTicketClaimedUnderALargeQuota(t *testing.T) {
	l, _ := newStandalone(t)
	ctx := context.Background()
	q := mustQuota(t, "pace", Window{1000, time.Hour})
	fast, slow := mustBucket(t, "hook", 20, 2), mustBucket(t, "hook", 5, 2)
	if _, _, err := l.Repace(ctx, fast, "gw"); err != nil {
		t.Fatal(err)
	}
	req := func(i int, b *Bucket) Request {
		r := bookReq("m"+strconv.Itoa(i), q, "r"+strconv.Itoa(i), b, 2500*time.Millisecond)
		r.book.Tenant, r.book.Weight, r.book.Horizon, r.book.Backlog = "t", 1, 2*time.Second, true
		return r
	}
	var ds []Decision
	for i := range 30 {
		ds = append(ds, mustAdmit(t, l, req(i, fast)))
	}
	k, now, err := l.Repace(ctx, slow, "gw")
	if err != nil || k != 4 {
		t.Fatalf("Repace to 5/s = %v, %v; want k 4", k, err)
	}
	for i := 10; i < 13; i++ {
		if !ds[i].Booked() || ds[i].Outcome == Placed {
			t.Fatalf("m%d at 20/s: %+v; want a ticket", i, ds[i])
		}
		want := scale(ds[i].At(), now, k)
		if want.Sub(now) > 2500*time.Millisecond {
			t.Fatalf("m%d scaled %s ahead: past the claim window, the test needs it within", i, want.Sub(now))
		}
		d := mustAdmit(t, l, req(i, slow))
		if !d.Allowed() || d.At().Sub(want).Abs() > time.Millisecond {
			t.Errorf("m%d claims its ticket moved to %s: %+v; want admitted then", i, want.Sub(now), d)
		}
	}
}
