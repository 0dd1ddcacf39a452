package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// Targeted tests of book.lua's fair shares and horizon, for the rules the
// random differential test seldom reaches. Each runs its operations on Redis
// and on the model in lockstep (differ.admit): decisions and every key
// (tenants hash, expiry set, places) must agree at each step, and W must
// be the weight of the tenants recorded (fairWeights).

// newFairDiffer returns a differ for a targeted test.
func newFairDiffer(t *testing.T) *differ {
	t.Helper()
	d := newDiffer(t, rand.New(rand.NewPCG(1, 2)), 0, time.Second)
	d.targeted = true
	return d
}

// lineOf is task id's booking request on bucket b at "gw" for tenant, with
// horizon ahead.
func (d *differ) lineOf(id, tenant string, w int, b *Bucket, ahead time.Duration) Request {
	return Request{ID: id, book: &Booking{Tenant: tenant, Weight: w, Horizon: ahead}, Takes: []Take{{Rule: b, Subject: "gw"}}}
}

// step admits r on both sides and returns the decision.
func (d *differ) step(r Request) Decision {
	d.t.Helper()
	d.last[r.ID] = r
	return d.admit(d.stats.admits, r)
}

// fairHash returns bucket b's tenants hash at "gw", as Redis holds it.
func (d *differ) fairHash(b *Bucket) map[string]string {
	d.t.Helper()
	h, err := d.rdb.HGetAll(context.Background(), keyspace.Fair(keyspace.Tag(DefaultPrefix, "gw"), b.Name())).Result()
	if err != nil {
		d.t.Fatal(err)
	}
	return h
}

// stale returns when tenant's record in h stops counting (its E), and
// fails the test if there is none.
func (d *differ) stale(h map[string]string, tenant string) time.Time {
	d.t.Helper()
	rec, ok := h[tenant]
	if !ok {
		d.t.Fatalf("no record of tenant %q: %v", tenant, h)
	}
	_, _, _, e := fairRecord(rec)
	return time.UnixMicro(int64(e) + 1000)
}

// takeSlots lets n priority tasks (which take no part in fair shares) take
// or book bucket b's first free slots, so that for some n slots from now a
// task books rather than goes, and finds no slot (however slow the machine
// running the test).
func (d *differ) takeSlots(b *Bucket, n int) {
	d.t.Helper()
	for range n {
		r := Request{ID: fmt.Sprint("prio-", d.stats.admits), book: &Booking{Priority: true}, Takes: []Take{{Rule: b, Subject: "gw"}}}
		if dec := d.step(r); !dec.Allowed() && !dec.Booked() {
			d.t.Fatalf("a priority task: %s, want to go or a slot", describeDecision(dec))
		}
	}
}

// queue admits n tasks of tenant and returns the last decision.
func (d *differ) queue(prefix, tenant string, w, n int, b *Bucket, ahead time.Duration) Decision {
	d.t.Helper()
	var dec Decision
	for i := range n {
		dec = d.step(d.lineOf(fmt.Sprint(prefix, i), tenant, w, b, ahead))
	}
	return dec
}

// TestFairPrunedTenant: a tenant that stops waiting leaves W (its record is
// pruned by the next booking of another tenant), and the others' shares
// grow at once: here the one left is alone again, its places one slot
// apart. The booking that prunes is one that expires at its place, which
// writes nothing else: W must follow all the same.
func TestFairPrunedTenant(t *testing.T) {
	d := newFairDiffer(t)
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	const ahead = 300 * time.Millisecond
	d.queue("b", "b", 1, 30, b, ahead) // b's line reaches ~3s ahead
	if a := d.step(d.lineOf("a0", "a", 2, b, ahead)); !a.Booked() {
		t.Fatalf("a0: %s, want a slot or a place in line", describeDecision(a))
	}
	h := d.fairHash(b)
	if h[modelFairW] != "3" {
		t.Fatalf("W = %q with b (1) and a (2) waiting: %v", h[modelFairW], h)
	}
	untilRedis(t, d.l, d.stale(h, "a"))

	d.takeSlots(b, 5)
	r := d.lineOf("b-late", "b", 1, b, ahead)
	r.book.Deadline = time.Now().Add(ahead)
	if dec := d.step(r); dec.Outcome != Expired {
		t.Fatalf("b-late: %s, want expired at its place", describeDecision(dec))
	}
	h = d.fairHash(b)
	if _, ok := h["a"]; ok || h[modelFairW] != "1" {
		t.Errorf("after a stopped waiting: %v; want no record of a and W = 1", modelStrings(h))
	}
	p1 := d.step(d.lineOf("b-next1", "b", 1, b, ahead))
	p2 := d.step(d.lineOf("b-next2", "b", 1, b, ahead))
	if gap := p2.At().Sub(p1.At()); p1.Outcome != Placed || p2.Outcome != Placed || gap != 100*time.Millisecond {
		t.Errorf("b alone again: places %s apart (%s, %s), want one slot", gap, describeDecision(p1), describeDecision(p2))
	}
}

// TestFairWeightChange: a tenant routed with another weight while it waits
// keeps the weight its record holds (its line was laid out at it), so
// that the reweigh a reload runs next finds the change and scales the
// places handed out; from the reweigh on, its stride and the others'
// follow the new weight.
func TestFairWeightChange(t *testing.T) {
	d := newFairDiffer(t)
	b := mustBucket(t, "sms", 10, 1)
	const ahead = 300 * time.Millisecond
	d.queue("b", "b", 1, 20, b, ahead)
	d.queue("a", "a", 1, 2, b, ahead)
	if h := d.fairHash(b); h[modelFairW] != "2" {
		t.Fatalf("W = %q with a and b waiting, weight 1 each", h[modelFairW])
	}
	a1 := d.step(d.lineOf("a-heavy1", "a", 3, b, ahead))
	a2 := d.step(d.lineOf("a-heavy2", "a", 3, b, ahead))
	h := d.fairHash(b)
	if _, _, w, _ := fairRecord(h["a"]); h[modelFairW] != "2" || w != 1 {
		t.Errorf("a routed at weight 3 before a reweigh: %v; want W = 2 and a's record at weight 1", modelStrings(h))
	}
	if gap := a2.At().Sub(a1.At()); gap != 200*time.Millisecond {
		t.Errorf("a's places %s apart before the reweigh; want 200ms (its record's weight 1 of 2)", gap)
	}
	d.weights["a"] = 3
	if yes, err := d.l.Reweighed(t.Context(), b, "gw", d.weights); err != nil || !yes {
		t.Fatalf("Reweighed after a was routed at weight 3: %v, %v; want true: the reweigh would find nothing to scale", yes, err)
	}
	d.reweigh(d.stats.admits, b, "gw")
	h = d.fairHash(b)
	if line, gate, w, _ := fairRecord(h["a"]); h[modelFairW] != "4" || w != 3 {
		t.Errorf("after the reweigh to a: 3: %v (line %v gate %v); want W = 4 and a's weight 3", modelStrings(h), line, gate)
	}
	a3 := d.step(d.lineOf("a-heavy3", "a", 3, b, ahead))
	a4 := d.step(d.lineOf("a-heavy4", "a", 3, b, ahead))
	if gap := a4.At().Sub(a3.At()); gap != 133334*time.Microsecond {
		t.Errorf("a's places %s apart at weight 3 of 4; want 133.334ms (100ms * 4/3, rounded up)", gap)
	}
	b1 := d.step(d.lineOf("b-after1", "b", 1, b, ahead))
	b2 := d.step(d.lineOf("b-after2", "b", 1, b, ahead))
	if gap := b2.At().Sub(b1.At()); gap != 400*time.Millisecond {
		t.Errorf("b's places %s apart at weight 1 of 4; want 400ms", gap)
	}
	// A worker not reloaded yet routes a at weight 1: the record's 3 holds.
	a5 := d.step(d.lineOf("a-light5", "a", 1, b, ahead))
	if gap := a5.At().Sub(a4.At()); gap != 133334*time.Microsecond {
		t.Errorf("a routed at weight 1 after the reweigh to 3: %s after its last place; want 133.334ms", gap)
	}
}

// TestFairReturner: a task back from its place in line, while every slot
// from its place to the horizon is busy, is spilled past the horizon and
// goes to its line's end; and a task whose place would be past its
// deadline expires, placed nowhere.
func TestFairReturner(t *testing.T) {
	d := newFairDiffer(t)
	b := mustBucket(t, "sms", 10, 1)
	const ahead = 300 * time.Millisecond
	var ds []Decision
	for i := range 12 {
		ds = append(ds, d.step(d.lineOf(fmt.Sprint("t", i), "", 1, b, ahead)))
	}
	if ds[6].Outcome != Placed || ds[11].Outcome != Placed {
		t.Fatalf("t6 %s, t11 %s: want places in line", describeDecision(ds[6]), describeDecision(ds[11]))
	}

	untilRedis(t, d.l, ds[6].At().Add(-ahead/2))
	d.takeSlots(b, 5) // every slot from now to past the horizon
	back := d.step(backFrom(d.last["t6"]))
	end := ds[11].At().Add(100 * time.Millisecond)
	if back.Outcome != Placed || back.At().Before(end) {
		t.Errorf("t6 back near its place, no slot free: %s at %s; want a place at its line's end, %s (or its first free slot, if later)", describeDecision(back), back.At(), end)
	}

	before := d.fairHash(b)
	r := d.lineOf("late", "", 1, b, ahead)
	r.book.Deadline = time.Now().Add(ahead)
	if dec := d.step(r); dec.Outcome != Expired {
		t.Errorf("a task whose place is past its deadline: %s, want expired", describeDecision(dec))
	}
	if after := d.fairHash(b); fmt.Sprint(modelStrings(after)) != fmt.Sprint(modelStrings(before)) {
		t.Errorf("an expired task moved its tenant's line: %v, was %v", modelStrings(after), modelStrings(before))
	}

	// The slots taken are given back: t8, back within the horizon of its
	// place, takes its slot (or goes, if it is now).
	var prio []string
	for id := range d.last {
		if strings.HasPrefix(id, "prio-") {
			prio = append(prio, id)
		}
	}
	slices.Sort(prio)
	for _, id := range prio {
		d.release(d.stats.admits, d.last[id])
	}
	untilRedis(t, d.l, ds[8].At().Add(-ahead/2))
	if dec := d.step(d.last["t8"]); !dec.Allowed() && (!dec.Booked() || dec.Outcome == Placed || dec.Delay > ahead) {
		t.Errorf("t8 back with its slot free: %s, want a slot within the horizon", describeDecision(dec))
	}
}

// TestFairStaleRecordPastPruneLimit: a booking prunes at most 8 tenants
// that stopped waiting; a tenant that comes back while its own stale record
// is not among them must not count twice in W.
func TestFairStaleRecordPastPruneLimit(t *testing.T) {
	d := newFairDiffer(t)
	// A slot of 500 ms: the steps below come far closer together than
	// that, on a busy machine too, so every tenant waits.
	b := mustBucket(t, "sms", 2, 1)
	const ahead = 500 * time.Millisecond
	d.queue("z", "z", 1, 40, b, ahead) // z waits ~20s: the hash lives on
	for i := 1; i <= 9; i++ {
		d.step(d.lineOf(fmt.Sprint("t", i, "-0"), fmt.Sprint("t", i), 1, b, ahead))
	}
	h := d.fairHash(b)
	if h[modelFairW] != "10" {
		t.Fatalf("W = %q with ten tenants waiting: %v", h[modelFairW], modelStrings(h))
	}
	// Every one of t1..t9 stops waiting (their records' order depends on
	// where each one's place fell, which a slow machine moves).
	var stale time.Time
	for i := 1; i <= 9; i++ {
		if s := d.stale(h, fmt.Sprint("t", i)); s.After(stale) {
			stale = s
		}
	}
	if z := d.stale(h, "z"); !z.After(stale) {
		t.Fatalf("z stops waiting (%s) before t1..t9 do (%s): the test needs it waiting", z, stale)
	}
	untilRedis(t, d.l, stale)
	d.takeSlots(b, 5)
	d.step(d.lineOf("t9-1", "t9", 1, b, ahead))
	if h := d.fairHash(b); h[modelFairW] != "2" {
		t.Errorf("after t1..t9 stopped waiting and t9 came back: %v; want W = 2 (z and t9)", modelStrings(h))
	}
}

// TestFairJoinCursor: tenants that start waiting together, past the
// horizon, take turns: their first places are one slot apart (the join
// cursor), not one crowd at the calendar's end; and a tenant's next place
// is a stride after its last with W as it is then, so that second places
// come after every first one, one slot apart: every place is a slot of its
// own.
func TestFairJoinCursor(t *testing.T) {
	d := newFairDiffer(t)
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	const ahead, tenants = 300 * time.Millisecond, 10
	slot := 100 * time.Millisecond
	var firsts, all []time.Time
	for round := range 2 {
		for k := range tenants {
			dec := d.step(d.lineOf(fmt.Sprint("t", k, "-", round), fmt.Sprint("t", k), 1, b, ahead))
			if dec.Outcome != Placed {
				continue
			}
			if round == 0 {
				firsts = append(firsts, dec.At())
			}
			all = append(all, dec.At())
		}
	}
	if len(firsts) < tenants/2 {
		t.Fatalf("%d of %d first tasks got a place in line; want most (the horizon holds 3 slots)", len(firsts), tenants)
	}
	for i := 1; i < len(firsts); i++ {
		if gap := firsts[i].Sub(firsts[i-1]); gap != slot {
			t.Errorf("first place %d is %s after the one before: want one slot (%s)", i, gap, slot)
		}
	}
	slices.SortFunc(all, time.Time.Compare)
	for i := 1; i < len(all); i++ {
		if gap := all[i].Sub(all[i-1]); gap < slot {
			t.Errorf("places %d and %d are %s apart: two tasks would come back for one slot", i-1, i, gap)
		}
	}
	if last, want := all[len(all)-1].Sub(all[0]), time.Duration(len(all)-1)*slot; last > want+slot {
		t.Errorf("%d places span %s: want about %s (one slot each)", len(all), last, want)
	}
}

// TestFairBehindCalendar: a task back from its place that finds the
// calendar behind its line (its first free slot more than a slot past its
// place, and not one it can go to within its max wait: priority tasks took
// the slots) takes a new place at its line's end instead of a ticket, so
// that the tasks after it find their slots free; one whose slot is at its
// place books it as before.
func TestFairBehindCalendar(t *testing.T) {
	d := newFairDiffer(t)
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	const ahead, maxWait = time.Second, 200 * time.Millisecond
	req := func(id string) Request {
		r := d.lineOf(id, "a", 1, b, ahead)
		r.MaxWait = maxWait
		return r
	}
	var places []Decision
	var ids []string
	for i := range 16 {
		if dec := d.step(req(fmt.Sprint("a", i))); dec.Outcome == Placed {
			places, ids = append(places, dec), append(ids, fmt.Sprint("a", i))
		}
	}
	if len(places) < 4 {
		t.Fatalf("%d of 16 placed in line; want the ones past the 1 s horizon", len(places))
	}
	first, firstID, secondID := places[0], ids[0], ids[1]
	untilRedis(t, d.l, first.At().Add(-100*time.Millisecond)) // woken at its place
	// The first is back with its slot free: it books it (at its place).
	if dec := d.step(backFrom(req(firstID))); dec.Outcome == Placed || !dec.Booked() && !dec.Allowed() {
		t.Fatalf("%s back with its slot free: %s, want its slot", firstID, describeDecision(dec))
	}
	// Priority tasks take the slots from there on, 3 s of them: past the
	// 2.5 s a task back from its place may sleep for its slot (CLAIM).
	d.takeSlots(b, 30)
	dec := d.step(backFrom(req(secondID)))
	if dec.Outcome != Placed || dec.At().Before(places[len(places)-1].At()) {
		t.Fatalf("%s back with the calendar behind its line: %s, want a new place at its line's end", secondID, describeDecision(dec))
	}
	if last := places[len(places)-1].At(); !dec.At().After(last) {
		t.Errorf("%s's new place %s is not after the line's last (%s)", secondID, dec.At().Format(time.StampMicro), last.Format(time.StampMicro))
	}
}
