package throttle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// bookReq is a booking request for task id: recipient rcpt through q (if
// any), provider gw through b (if any).
func bookReq(id string, q *Quota, rcpt string, b *Bucket, maxWait time.Duration) Request {
	r := Request{ID: id, book: &Booking{}, MaxWait: maxWait}
	if q != nil {
		r.Takes = append(r.Takes, Take{Rule: q, Subject: rcpt})
	}
	if b != nil {
		r.Takes = append(r.Takes, Take{Rule: b, Subject: "gw"})
	}
	return r
}

// untilRedis sleeps until Redis time reaches at: the passage of time is
// what these tests are about (a booked moment comes), so they wait for it.
func untilRedis(t *testing.T, l *Limiter, at time.Time) {
	t.Helper()
	now, err := l.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(at.Sub(now))
}

func TestBookProviderBacklogInOrder(t *testing.T) {
	l, rdb := newStandalone(t)
	b := mustBucket(t, "sms", 10, 2) // a slot every 100 ms
	const maxWait = 150 * time.Millisecond
	var booked []Decision
	for i := range 40 {
		d := mustAdmit(t, l, bookReq(fmt.Sprint("t", i), nil, "", b, maxWait))
		switch {
		case d.Allowed():
			if len(booked) > 0 {
				t.Fatalf("t%d allowed after t%d was booked: %+v", i, i-len(booked), d)
			}
		case d.Booked():
			booked = append(booked, d)
		default:
			t.Fatalf("t%d: neither allowed nor booked: %+v", i, d)
		}
	}
	if len(booked) < 30 {
		t.Fatalf("%d booked of 40 at 10/s burst 2", len(booked))
	}
	for i := 1; i < len(booked); i++ {
		gap := booked[i].At().Sub(booked[i-1].At())
		if gap < 100*time.Millisecond-2*time.Microsecond || gap > 100*time.Millisecond+2*time.Microsecond {
			t.Errorf("booking %d is %s after the one before: want one slot (100ms)", i, gap)
		}
		if booked[i].Ahead != booked[i-1].Ahead+1 {
			t.Errorf("booking %d has %d ahead, the one before %d", i, booked[i].Ahead, booked[i-1].Ahead)
		}
		if booked[i].TakeIndex != 0 || booked[i].Rule != b {
			t.Errorf("booking %d is bound by take %d (%v), want the bucket", i, booked[i].TakeIndex, booked[i].Rule)
		}
	}

	// Coming back early changes nothing and tells the same moment.
	first := len(booked) - 1 // the last one: far enough ahead to be early
	id := fmt.Sprint("t", 40-len(booked)+first)
	before := snapshot(t, rdb)
	again := mustAdmit(t, l, bookReq(id, nil, "", b, maxWait))
	if !again.Booked() || !again.At().Equal(booked[first].At()) {
		t.Fatalf("early return of %s: %+v, want booked for %s", id, again, booked[first].At())
	}
	if after := snapshot(t, rdb); !maps.Equal(before, after) {
		t.Errorf("an early return wrote to Redis")
	}

	// At its moment, the first booked task claims it.
	id0 := fmt.Sprint("t", 40-len(booked))
	untilRedis(t, l, booked[0].At().Add(-maxWait/2))
	c := mustAdmit(t, l, bookReq(id0, nil, "", b, maxWait))
	// It goes when the bucket has its tokens: at its moment, or a µs
	// before it (moments are whole µs, the refill is not).
	if !c.Allowed() || !c.Claimed.Equal(booked[0].At()) || booked[0].At().Sub(c.At()) > time.Microsecond {
		t.Fatalf("claim of %s at its moment: %+v, want allowed at %s", id0, c, booked[0].At())
	}
	if n, _ := rdb.ZCard(context.Background(), keyspace.Book(keyspace.Tag(DefaultPrefix, "gw"), "sms")).Result(); n != int64(len(booked)-1) {
		t.Errorf("%d tickets left after one claim of %d", n, len(booked))
	}
	// A claim is idempotent like any admission.
	if r := mustAdmit(t, l, bookReq(id0, nil, "", b, maxWait)); !r.Allowed() || r.Outcome != Repeated || !r.At().Equal(c.At()) {
		t.Errorf("claim again: %+v, want the same admission repeated", r)
	}
}

func TestBookRecipientWindowsFIFO(t *testing.T) {
	l, _ := newStandalone(t)
	q := mustQuota(t, "p", Window{1, time.Second}, Window{2, 10 * time.Second})
	var ds []Decision
	for i := range 5 {
		ds = append(ds, mustAdmit(t, l, bookReq(fmt.Sprint("m", i), q, "alice", nil, 0)))
	}
	if !ds[0].Allowed() {
		t.Fatalf("first message: %+v", ds[0])
	}
	t0 := ds[0].At()
	// 1 per 1s and 2 per 10s: t0, t0+1s, then the 10 s window rules.
	want := []time.Duration{0, time.Second, 10 * time.Second, 11 * time.Second, 20 * time.Second}
	for i, d := range ds[1:] {
		if !d.Booked() {
			t.Fatalf("message %d: %+v, want booked", i+1, d)
		}
		if got := d.At().Sub(t0); got != want[i+1] {
			t.Errorf("message %d booked at t0+%s, want t0+%s", i+1, got, want[i+1])
		}
		if d.Ahead != i {
			t.Errorf("message %d: %d ahead, want %d", i+1, d.Ahead, i)
		}
	}
	if ds[2].Limit != "2 per 10s" || ds[1].Limit != "1 per 1s" {
		t.Errorf("binding limits %q and %q", ds[1].Limit, ds[2].Limit)
	}
}

func TestBookCommonMoment(t *testing.T) {
	l, _ := newStandalone(t)
	q := mustQuota(t, "p", Window{1, 3 * time.Second})
	b := mustBucket(t, "sms", 1, 1)
	// bob's first message takes the bucket's only token; alice's first then
	// waits for the bucket, her second for her window.
	d0 := mustAdmit(t, l, bookReq("b0", q, "bob", b, 0))
	d1 := mustAdmit(t, l, bookReq("a0", q, "alice", b, 0))
	d2 := mustAdmit(t, l, bookReq("a1", q, "alice", b, 0))
	if !d0.Allowed() || !d1.Booked() || !d2.Booked() {
		t.Fatalf("decisions %+v / %+v / %+v", d0, d1, d2)
	}
	if got := d1.At().Sub(d0.At()); got < time.Second-2*time.Microsecond || got > time.Second+2*time.Microsecond {
		t.Errorf("alice's first is booked %s after bob's: want the bucket's next slot (1s)", got)
	}
	if _, ok := d1.Rule.(*Bucket); !ok {
		t.Errorf("alice's first is bound by %v, want the bucket", d1.Rule)
	}
	if got := d2.At().Sub(d1.At()); got != 3*time.Second {
		t.Errorf("alice's second is booked %s after her first: want her window (3s)", got)
	}
	if _, ok := d2.Rule.(*Quota); !ok {
		t.Errorf("alice's second is bound by %v, want her quota", d2.Rule)
	}
}

func TestBookDeadlineExpiresWithoutTrace(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "p", Window{1, time.Hour})
	mustAdmit(t, l, bookReq("m0", q, "alice", nil, 0))
	now, _ := rdb.Time(context.Background()).Result()
	before := snapshot(t, rdb)
	r := bookReq("m1", q, "alice", nil, 0)
	r.book.Deadline = now.Add(10 * time.Minute)
	d := mustAdmit(t, l, r)
	if d.Outcome != Expired || d.Booked() || d.Allowed() {
		t.Fatalf("booking past the deadline: %+v, want expired", d)
	}
	if w := d.At().Sub(now); w < 59*time.Minute {
		t.Errorf("expired with its moment %s ahead, want about an hour", w)
	}
	if after := snapshot(t, rdb); !maps.Equal(before, after) {
		t.Errorf("an expired booking wrote to Redis")
	}
	var te *ThrottledError
	if err := d.Err(); !errors.As(err, &te) {
		t.Errorf("Err() = %v", err)
	}
}

func TestBookReleaseGivesBack(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	q := mustQuota(t, "p", Window{1, time.Minute})
	b := mustBucket(t, "sms", 1, 1)
	mustAdmit(t, l, bookReq("m0", q, "alice", b, 0))
	d := mustAdmit(t, l, bookReq("m1", q, "alice", b, 0))
	if !d.Booked() {
		t.Fatalf("%+v", d)
	}
	n, err := l.Release(ctx, bookReq("m1", q, "alice", b, 0))
	if err != nil || n != 2 {
		t.Fatalf("Release = %d, %v; want its quota entry and its ticket", n, err)
	}
	tag := keyspace.Tag(DefaultPrefix, "alice")
	if _, err := rdb.ZScore(ctx, keyspace.Quota(tag, "p"), "m1").Result(); err == nil {
		t.Errorf("the released booking's quota entry is still there")
	}
	if _, err := rdb.ZScore(ctx, keyspace.Book(keyspace.Tag(DefaultPrefix, "gw"), "sms"), "m1").Result(); err == nil {
		t.Errorf("the released booking's ticket is still there")
	}
	// The next message books where the released one was.
	d2 := mustAdmit(t, l, bookReq("m2", q, "alice", b, 0))
	if !d2.Booked() || !d2.At().Equal(d.At()) {
		t.Errorf("after a release, the next booking: %+v; want the released moment %s", d2, d.At())
	}
}

func TestBookLateClaimBooksAgain(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	q := mustQuota(t, "p", Window{1, 300 * time.Millisecond})
	const maxWait = 50 * time.Millisecond
	a := mustAdmit(t, l, bookReq("a", q, "alice", nil, maxWait))
	bd := mustAdmit(t, l, bookReq("b", q, "alice", nil, maxWait))
	cd := mustAdmit(t, l, bookReq("c", q, "alice", nil, maxWait))
	if !a.Allowed() || !bd.Booked() || !cd.Booked() {
		t.Fatalf("%+v / %+v / %+v", a, bd, cd)
	}
	// c claims on time; b comes back after c's moment: moving its entry
	// there would put two in one window, so it books again, after c.
	untilRedis(t, l, cd.At().Add(-maxWait/2))
	if c := mustAdmit(t, l, bookReq("c", q, "alice", nil, maxWait)); !c.Allowed() {
		t.Fatalf("c at its moment: %+v", c)
	}
	late := mustAdmit(t, l, bookReq("b", q, "alice", nil, maxWait))
	if !late.Booked() || late.Outcome != Rebooked {
		t.Fatalf("b, late: %+v; want booked again", late)
	}
	if late.At().Before(cd.At().Add(300 * time.Millisecond)) {
		t.Errorf("b booked again for %s, before c's moment + the window (%s)", late.At(), cd.At().Add(300*time.Millisecond))
	}
	s, err := rdb.ZScore(ctx, keyspace.Quota(keyspace.Tag(DefaultPrefix, "alice"), "p"), "b").Result()
	if err != nil || int64(s) != late.At().UnixMicro() {
		t.Errorf("b's entry is at %v (%v), want its new moment %d", s, err, late.At().UnixMicro())
	}
}

func TestBookLateClaimThatFitsGoes(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	q := mustQuota(t, "p", Window{1, 200 * time.Millisecond})
	const maxWait = 50 * time.Millisecond
	mustAdmit(t, l, bookReq("a", q, "alice", nil, maxWait))
	bd := mustAdmit(t, l, bookReq("b", q, "alice", nil, maxWait))
	// b comes back 300 ms late with nothing booked after it: its entry moves
	// to the moment it goes.
	untilRedis(t, l, bd.At().Add(300*time.Millisecond))
	d := mustAdmit(t, l, bookReq("b", q, "alice", nil, maxWait))
	if !d.Allowed() || d.At().Before(bd.At().Add(300*time.Millisecond)) {
		t.Fatalf("late b: %+v", d)
	}
	s, _ := rdb.ZScore(ctx, keyspace.Quota(keyspace.Tag(DefaultPrefix, "alice"), "p"), "b").Result()
	if int64(s) != d.At().UnixMicro() {
		t.Errorf("b's entry at %d, want the moment it went, %d", int64(s), d.At().UnixMicro())
	}
}

// A booking whose slot starts after its quotas' moment (another subject's
// slot is in the way) may be claimed after that moment and still inside
// its slot: it goes then only if its recipient's windows allow it there.
// (BenchmarkRecipientBurst's slots sit a few ms past their moments; a
// claim that moved its entry into the next one's window would break it.)
func TestBookLateClaimInsideItsSlotKeepsTheWindow(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	q := mustQuota(t, "p", Window{1, time.Second})
	b := mustBucket(t, "sms", 5, 2) // 200 ms slots, 200 ms of slack
	const maxWait = 50 * time.Millisecond
	a := mustAdmit(t, l, bookReq("a", q, "alice", b, maxWait))
	if !a.Allowed() {
		t.Fatalf("a: %+v", a)
	}
	// bob's takes fill the slots from a's to a + 1.2 s, so b's slot starts
	// 200 ms after its quota moment (a + 1 s); c books a + 2 s.
	for i := range 5 {
		mustAdmit(t, l, bookReq(fmt.Sprint("bob", i), nil, "", b, 0))
	}
	bd := mustAdmit(t, l, bookReq("b", q, "alice", b, maxWait))
	cd := mustAdmit(t, l, bookReq("c", q, "alice", b, maxWait))
	if !bd.Booked() || bd.At().Sub(a.At()) != time.Second || !cd.Booked() || cd.At().Sub(a.At()) != 2*time.Second {
		t.Fatalf("b %+v, c %+v; want booked at a + 1s and a + 2s", bd, cd)
	}
	untilRedis(t, l, bd.At().Add(100*time.Millisecond))
	late := mustAdmit(t, l, bookReq("b", q, "alice", b, maxWait))
	key := keyspace.Quota(keyspace.Tag(DefaultPrefix, "alice"), "p")
	s, err := rdb.ZScore(ctx, key, "b").Result()
	if err != nil {
		t.Fatal(err)
	}
	if late.Allowed() || late.Outcome != Rebooked || time.UnixMicro(int64(s)).Before(cd.At().Add(time.Second)) {
		t.Errorf("b claimed 100 ms into its slot, c booked 900 ms later: %+v, entry at %s; want booked again after c + 1s (%s)",
			late, time.UnixMicro(int64(s)), cd.At().Add(time.Second))
	}
}

func TestBookPriorityTakesTheReserve(t *testing.T) {
	l, _ := newStandalone(t)
	b, err := mustBucket(t, "sms", 2, 4).WithReserve(2)
	if err != nil {
		t.Fatal(err)
	}
	var bulk []Decision
	for i := range 10 {
		bulk = append(bulk, mustAdmit(t, l, bookReq(fmt.Sprint("bulk", i), nil, "", b, 0)))
	}
	allowed := 0
	for _, d := range bulk {
		if d.Allowed() {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("%d bulk allowed at once from a burst of 4 with 2 reserved", allowed)
	}
	last := bulk[len(bulk)-1].At()
	for i := range 2 {
		r := bookReq(fmt.Sprint("otp", i), nil, "", b, 0)
		r.book.Priority = true
		d := mustAdmit(t, l, r)
		if !d.Allowed() || d.Delay != 0 {
			t.Fatalf("priority %d behind 8 bookings: %+v; want allowed now", i, d)
		}
	}
	// The priority sends pushed the line: the next booking is two slots
	// later than it would have been.
	next := mustAdmit(t, l, bookReq("bulk10", nil, "", b, 0))
	if want := last.Add(3 * 500 * time.Millisecond); !next.At().Equal(want) {
		t.Errorf("the booking after two priority sends is at %s, want %s (three slots after the last)", next.At(), want)
	}
}

func TestBookValidation(t *testing.T) {
	l, _ := newStandalone(t)
	b1, b2 := mustBucket(t, "sms", 1, 1), mustBucket(t, "push", 1, 1)
	r := Request{ID: "x", book: &Booking{}, Takes: []Take{{Rule: b1, Subject: "a"}, {Rule: b2, Subject: "a"}}}
	if _, err := l.Admit(context.Background(), r); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Admit(%v) = %v, want ErrInvalidRequest", r.Takes, err)
	}
	if _, err := b1.WithReserve(1); !errors.Is(err, ErrInvalidRule) {
		t.Errorf("a reserve of the whole burst: %v", err)
	}
}

// A booked slot is its task's: a job that comes back in time goes at its
// moment whatever was booked since, and a slot given back (the job was
// released) is the next booking's, not a hole in the line. A job back late
// but within its slot goes in it (nobody else can use it); a slot a job
// misses is lost (one slot), and the job books again.
func TestBookSlotIsTheTasks(t *testing.T) {
	l, _ := newStandalone(t)
	const maxWait = 700 * time.Millisecond
	b1 := mustBucket(t, "one", 2, 1) // a slot every 500 ms, no slack
	a := mustAdmit(t, l, bookReq("a", nil, "", b1, 0))
	bd := mustAdmit(t, l, bookReq("b", nil, "", b1, 0))
	cd := mustAdmit(t, l, bookReq("c", nil, "", b1, 0))
	dd := mustAdmit(t, l, bookReq("d", nil, "", b1, 0))
	if !a.Allowed() || !bd.Booked() || !cd.Booked() || !dd.Booked() {
		t.Fatalf("%+v / %+v / %+v / %+v", a, bd, cd, dd)
	}
	for i, d := range []Decision{a, bd, cd, dd} {
		if want := a.At().Add(time.Duration(i) * 500 * time.Millisecond); d.At().Sub(want).Abs() > time.Microsecond {
			t.Errorf("booking %d at %s, want %s: one slot after another", i, d.At(), want)
		}
	}

	// c is released: its slot goes to the next booking, e, before d's.
	if n, err := l.Release(ctx, bookReq("c", nil, "", b1, 0)); n != 1 || err != nil {
		t.Fatalf("release c: %d, %v", n, err)
	}
	e := mustAdmit(t, l, bookReq("e", nil, "", b1, 0))
	if !e.Booked() || e.At().Sub(cd.At()).Abs() > time.Microsecond {
		t.Fatalf("e after c was released: %+v; want booked at c's moment %s", e, cd.At())
	}

	// b misses its slot; d comes back in time and goes at its own moment.
	untilRedis(t, l, dd.At().Add(-maxWait+50*time.Millisecond))
	d := mustAdmit(t, l, bookReq("d", nil, "", b1, maxWait))
	if !d.Allowed() || d.At().Sub(dd.At()).Abs() > time.Microsecond || !d.Claimed.Equal(dd.At()) {
		t.Errorf("d claims: %+v; want allowed at its moment %s", d, dd.At())
	}
	// e comes back late, but within its slot: it goes, in its slot.
	untilRedis(t, l, e.At().Add(200*time.Millisecond))
	if late := mustAdmit(t, l, bookReq("e", nil, "", b1, maxWait)); !late.Allowed() || !late.Claimed.Equal(e.At()) {
		t.Errorf("e back 200ms late, within its 500ms slot: %+v; want it to go, its claim at %s", late, e.At())
	}
	// b comes back after its slot ended: it books again, after the line.
	b := mustAdmit(t, l, bookReq("b", nil, "", b1, maxWait))
	if !b.Booked() || b.Outcome != Rebooked || !b.At().After(dd.At()) {
		t.Errorf("b after its slot: %+v; want booked again after d's %s", b, dd.At())
	}
}

// A booked task that comes back while a slot is free now (the two before it
// were given back) holds a ticket: it does not go the plain way. Its check
// records it in the ledger on the way (a plain admission's ZADD NX), and
// finding the ticket undoes that: the return changes nothing in Redis.
func TestBookEarlyReturnWithTicketLeavesNoTrace(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	// A slot every 2 s, no slack: m2's is 4 s ahead, further than a booked
	// task may claim its moment (2.5 s, CLAIM in lua/book.lua).
	b := mustBucket(t, "sms", 0.5, 1)
	if d := mustAdmit(t, l, bookReq("m0", nil, "", b, 0)); !d.Allowed() {
		t.Fatalf("m0: %+v, want allowed", d)
	}
	if d := mustAdmit(t, l, bookReq("m1", nil, "", b, 0)); !d.Booked() {
		t.Fatalf("m1: %+v, want booked", d)
	}
	d := mustAdmit(t, l, bookReq("m2", nil, "", b, 0))
	if !d.Booked() || d.Delay < 3500*time.Millisecond {
		t.Fatalf("m2: %+v, want booked about 4 s ahead", d)
	}
	for _, id := range []string{"m0", "m1"} {
		if n, err := l.Release(ctx, bookReq(id, nil, "", b, 0)); err != nil || n != 1 {
			t.Fatalf("Release(%s) = %d, %v", id, n, err)
		}
	}
	before := snapshot(t, rdb)
	again := mustAdmit(t, l, bookReq("m2", nil, "", b, 0))
	if !again.Booked() || !again.At().Equal(d.At()) {
		t.Fatalf("m2 back early: %+v, want booked for %s", again, d.At())
	}
	if after := snapshot(t, rdb); !equalMaps(before, after) {
		t.Errorf("m2's early return changed Redis")
	}
}

// TestPauseMovesTheLineBehindIt: a provider's pause (a 429's Retry-After)
// shifts the bookings waiting on its bucket by the time the pause adds, in
// their order and spacing, rather than leaving those inside the pause to
// come back and book again behind everyone (one more admission each, and
// out of order). A second pause to the same end moves nothing more.
func TestPauseMovesTheLineBehindIt(t *testing.T) {
	l, _ := newStandalone(t)
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	var before []time.Time
	for i := range 20 {
		d := mustAdmit(t, l, bookReq(fmt.Sprint("t", i), nil, "", b, 0))
		if i > 0 && d.Outcome != Booked {
			t.Fatalf("t%d: %+v, want booked", i, d)
		}
		before = append(before, d.At())
	}
	const pause = 3 * time.Second
	if _, err := l.Pause(ctx, b, "gw", pause); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Pause(ctx, b, "gw", pause-50*time.Millisecond); err != nil { // a second worker's 429, a moment later
		t.Fatal(err)
	}
	var after []time.Time
	for i := 1; i < 20; i++ { // t0 went at once
		d := mustAdmit(t, l, bookReq(fmt.Sprint("t", i), nil, "", b, 0))
		if d.Outcome != Booked {
			t.Fatalf("t%d after the pause: %+v, want told its (moved) moment", i, d)
		}
		after = append(after, d.At())
	}
	// t0 went at the Redis time of the first booking, before the pause began.
	if end := before[0].Add(pause); after[0].Before(end) {
		t.Errorf("first booking after the pause at %s, before the pause ends (after %s)", after[0].Format("15:04:05.000"), end.Format("15:04:05.000"))
	}
	shift := after[0].Sub(before[1])
	if shift < pause-200*time.Millisecond || shift > pause+300*time.Millisecond {
		t.Errorf("the line moved by %s, want about the pause (%s)", shift, pause)
	}
	for i := 1; i < len(after); i++ {
		if got, want := after[i].Sub(after[i-1]), before[i+1].Sub(before[i]); got != want {
			t.Errorf("bookings %d and %d are %s apart after the pause, %s before", i, i+1, got, want)
		}
	}
}

// TestPauseKeepsARecipientsLine: after a pause moved the bookings waiting
// on a bucket, a recipient's booked messages, spaced by its window, claim
// their moved moments one after another: each one's entry moves with its
// slot, past the next one's entry, which moves when that one claims. None
// books again at the end of the recipient's line.
func TestPauseKeepsARecipientsLine(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "mkt", Window{1, 500 * time.Millisecond})
	b := mustBucket(t, "sms", 100, 1)
	req := func(i int) Request { return bookReq(fmt.Sprint("t", i), q, "alice", b, 0) }
	for i := range 5 {
		if d := mustAdmit(t, l, req(i)); i > 0 && d.Outcome != Booked {
			t.Fatalf("t%d: %+v, want booked", i, d)
		}
	}
	if _, err := l.Pause(ctx, b, "gw", time.Second); err != nil {
		t.Fatal(err)
	}
	var went []time.Time
	for i := 1; i <= 2; i++ {
		d := mustAdmit(t, l, req(i))
		if d.Outcome != Admitted {
			t.Fatalf("t%d claims after the pause: %s, want admitted at its moved moment (%+v)", i, d.Outcome, d)
		}
		went = append(went, d.At())
	}
	if gap := went[1].Sub(went[0]); gap < 500*time.Millisecond {
		t.Errorf("t1 and t2 go %s apart, want a window (500ms) at least", gap)
	}
	if n := rdb.ZCard(ctx, keyspace.Quota(keyspace.Tag(DefaultPrefix, "alice"), "mkt")).Val(); n != 5 {
		t.Errorf("alice's quota holds %d entries, want the 5 messages'", n)
	}
}

// TestBookLineIsOneSpan: bookings that each start where the one before ends
// (here a recipient's window of one slot spaces them, as places in a line
// do) fill the calendar as one busy span. Sought from the end of the span
// before, each was written as a span of its own beside it: the calendar
// held a span per booking, every later search from before the line
// stepped over them one by one, and past 64 gave up: another recipient's
// booking was told to wait an hour.
func TestBookLineIsOneSpan(t *testing.T) {
	l, rdb := newStandalone(t)
	q := mustQuota(t, "p", Window{1, 100 * time.Millisecond})
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	const n = 70
	var last Decision
	for i := range n {
		last = mustAdmit(t, l, bookReq(fmt.Sprint("m", i), q, "alice", b, 0))
		if i > 0 && !last.Booked() {
			t.Fatalf("m%d: %+v, want booked", i, last)
		}
	}
	spans, err := rdb.ZRangeByScoreWithScores(context.Background(), keyspace.Slots(keyspace.Tag(DefaultPrefix, "gw"), "sms"),
		&redis.ZRangeBy{Min: "1", Max: "+inf"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != 1 {
		t.Errorf("%d bookings a slot apart: the calendar holds %d spans, want 1", n, len(spans))
	}
	d := mustAdmit(t, l, bookReq("bob0", q, "bob", b, 0))
	if !d.Booked() || d.At().Sub(last.At()) != 100*time.Millisecond {
		t.Errorf("bob's booking after alice's line (last at %s): %s, want the slot after it", last.At(), describeDecision(d))
	}
}

// TestBookFragmentedCalendarWaitsUntilTheSearchEnds: a take that finds no
// slot within the 64 spans a search steps over (every gap too short for
// it: here a two-slot take among one-slot gaps) is denied until where the
// search got, not for an hour, by Admit and by Book alike.
func TestBookFragmentedCalendarWaitsUntilTheSearchEnds(t *testing.T) {
	l, _ := newStandalone(t)
	q := mustQuota(t, "p", Window{1, 200 * time.Millisecond})
	b := mustBucket(t, "sms", 10, 2) // a slot every 100 ms; burst 2 for the two-slot take
	const n = 80                     // alice's: a slot busy, a slot free, and so on
	var last Decision
	for i := range n {
		last = mustAdmit(t, l, bookReq(fmt.Sprint("m", i), q, "alice", b, 0))
	}
	if !last.Booked() {
		t.Fatalf("alice's last: %s, want booked", describeDecision(last))
	}
	wide := func(id string, book bool) Decision {
		r := Request{ID: id, book: booked(book), Takes: []Take{{Rule: b, Subject: "gw", Cost: 2}}}
		return mustAdmit(t, l, r)
	}
	for _, book := range []bool{false, true} {
		d := wide(fmt.Sprint("wide-", book), book)
		// 64 spans from now: about 12.8 s of alice's slots (a span every 200 ms).
		if d.Allowed() || d.Delay < 10*time.Second || d.Delay > 14*time.Second {
			t.Errorf("a two-slot take (book %v) behind %d one-slot gaps: %s, want denied for about 12.8 s (where the search got)", book, n, describeDecision(d))
		}
	}
}
