package throttle

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// lineReq is a booking request on bucket b (at "gw") for task id of
// tenant, with a horizon.
func lineReq(id, tenant string, weight int, b *Bucket, ahead time.Duration) Request {
	r := bookReq(id, nil, "", b, 0)
	r.book.Tenant, r.book.Weight, r.book.Horizon = tenant, weight, ahead
	return r
}

// backFrom is r as a task back from its place in line: its caller kept
// that it was placed (Booking.Back).
func backFrom(r Request) Request {
	b := *r.book
	b.Back, r.book = true, &b
	return r
}

// TestBookAheadHorizon: slots are booked at most the horizon ahead; past it
// a task gets a place in its tenant's line, one slot apart, holding nothing
// in the bucket's keys.
func TestBookAheadHorizon(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	const ahead = time.Second
	var booked, queued []Decision
	var lastBooked string
	for i := range 40 {
		d := mustAdmit(t, l, lineReq(fmt.Sprint("t", i), "", 1, b, ahead))
		switch {
		case d.Outcome == Placed:
			queued = append(queued, d)
		case d.Booked():
			if len(queued) > 0 {
				t.Fatalf("t%d booked a slot after t%d was placed in line: %+v", i, i-1, d)
			}
			if d.Delay > ahead {
				t.Errorf("t%d booked %s ahead: past the horizon %s", i, d.Delay, ahead)
			}
			booked = append(booked, d)
			lastBooked = fmt.Sprint("t", i)
		case !d.Allowed():
			t.Fatalf("t%d: %+v", i, d)
		}
	}
	if len(queued) < 25 {
		t.Fatalf("%d of 40 placed in line with a horizon of 1s at 10/s", len(queued))
	}
	for i := 1; i < len(queued); i++ {
		if gap := queued[i].At().Sub(queued[i-1].At()); gap != 100*time.Millisecond {
			t.Errorf("place %d is %s after the one before: want one slot", i, gap)
		}
	}
	if first, last := queued[0].At(), booked[len(booked)-1].At(); first.Before(last) {
		t.Errorf("first place in line %s before the last slot booked %s", first, last)
	}
	tickets, err := rdb.ZCard(ctx, keyspace.Book(keyspace.Tag(DefaultPrefix, "gw"), "sms")).Result()
	if err != nil || tickets != int64(len(booked)) {
		t.Errorf("tickets %d (%v), want %d (one per slot booked, none for places in line)", tickets, err, len(booked))
	}

	// A task new to the line joins its end.
	d := mustAdmit(t, l, lineReq("late", "", 1, b, ahead))
	if d.Outcome != Placed || d.At().Sub(queued[len(queued)-1].At()) != 100*time.Millisecond {
		t.Errorf("a new task: %+v; want a place one slot after the last (%s)", d, queued[len(queued)-1].At())
	}

	// Released: the slot is the next booking's, not held behind the gate of
	// a tenant alone.
	first := booked[len(booked)-1]
	if _, err := l.Release(ctx, lineReq(lastBooked, "", 1, b, ahead)); err != nil {
		t.Fatal(err)
	}
	// A task back at its place takes the first free slot from now: the
	// released one, to sleep for (within CLAIM of it, as a ticket's claim
	// may: it was woken for it). Not back, it would join the line's end.
	if d = mustAdmit(t, l, backFrom(lineReq("t39", "", 1, b, ahead))); !d.Allowed() || !d.At().Equal(first.At()) {
		t.Errorf("a task back at its place after a release: %+v; want the released slot at %s", d, first.At())
	}
}

// TestFairShareTwoTenants: a tenant that starts waiting behind another's
// line gets its share at once: its places go every other slot from the
// first free one, and the first tenant's new places are spaced to leave
// room for it. Weights set the shares.
func TestFairShareTwoTenants(t *testing.T) {
	for _, tc := range []struct {
		name          string
		wBig, wSmall  int
		bigGap, small time.Duration // spacing of each tenant's places while both wait
	}{
		{"equal", 1, 1, 200 * time.Millisecond, 200 * time.Millisecond},
		{"2:1", 2, 1, 150 * time.Millisecond, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := newStandalone(t)
			b := mustBucket(t, "sms", 10, 1)
			const ahead = time.Second
			var bigLast time.Time
			for i := range 60 {
				d := mustAdmit(t, l, lineReq(fmt.Sprint("big", i), "big", tc.wBig, b, ahead))
				bigLast = d.At()
			}
			if time.Until(bigLast) < 5*time.Second {
				t.Fatalf("big's 60th at %s: want about 6s ahead", bigLast)
			}
			var small []time.Time
			for i := range 10 {
				d := mustAdmit(t, l, lineReq(fmt.Sprint("small", i), "small", tc.wSmall, b, ahead))
				if !d.Booked() {
					t.Fatalf("small%d: %+v", i, d)
				}
				small = append(small, d.At())
			}
			if small[9].After(bigLast) {
				t.Fatalf("small's 10th at %s, after big's whole line (%s): no share", small[9], bigLast)
			}
			if wait := time.Until(small[0]); wait > ahead+200*time.Millisecond {
				t.Errorf("small's first in %s: want within the horizon", wait)
			}
			for i := 2; i < len(small); i++ {
				if gap := small[i].Sub(small[i-1]); gap != tc.small {
					t.Errorf("small's place %d is %s after the one before: want %s", i, gap, tc.small)
				}
			}
			// big's new tasks now join its line at its share's spacing.
			p1 := mustAdmit(t, l, lineReq("bigA", "big", tc.wBig, b, ahead))
			p2 := mustAdmit(t, l, lineReq("bigB", "big", tc.wBig, b, ahead))
			if gap := p2.At().Sub(p1.At()); gap != tc.bigGap {
				t.Errorf("big's places while small waits are %s apart: want %s", gap, tc.bigGap)
			}
		})
	}
}

// TestFairStateReleased: a tenant's record goes once it has nothing
// waiting, and the weights of the tenants waiting follow.
func TestFairStateReleased(t *testing.T) {
	l, rdb := newStandalone(t)
	ctx := context.Background()
	// 30 tasks are 3 s of slots: the tenant waits however slowly they come.
	b := mustBucket(t, "sms", 10, 1)
	tag := keyspace.Tag(DefaultPrefix, "gw")
	for i := range 30 {
		mustAdmit(t, l, lineReq(fmt.Sprint("a", i), "a", 1, b, 5*time.Millisecond))
	}
	n, err := rdb.HLen(ctx, keyspace.Fair(tag, "sms")).Result()
	if err != nil || n != 4 {
		t.Fatalf("tenants hash holds %d fields (%v), want the tenant, W, the join cursor and the places' end", n, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := rdb.Exists(ctx, keyspace.Fair(tag, "sms"), keyspace.Tenants(tag, "sms")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tenant's state is still there 20s after its last place")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A priority task takes the slot of a task that claimed it and sleeps until
// it; that task finds out by HasSlot before it sends.
func TestPriorityTakesAClaimedSlot(t *testing.T) {
	l, _ := newStandalone(t)
	ctx := context.Background()
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	req := func(id string, prio bool) Request {
		r := bookReq(id, nil, "", b, 2*time.Second)
		r.book.Priority = prio
		return r
	}
	var last Decision
	for i := range 11 {
		if last = mustAdmit(t, l, req(fmt.Sprint("t", i), false)); !last.Allowed() {
			t.Fatalf("t%d: %+v; want admitted within max wait", i, last)
		}
	}
	d := mustAdmit(t, l, req("otp", true))
	if !d.Allowed() || d.Delay > 300*time.Millisecond {
		t.Fatalf("priority task: %+v; want a slot within 300ms (the first claimed one more than 50ms ahead), not after t10 (%s)", d, last.Delay)
	}
	lost := 0
	for i := range 11 {
		held, err := l.HasSlot(ctx, req(fmt.Sprint("t", i), false))
		if err != nil {
			t.Fatal(err)
		}
		if !held {
			lost++
		}
	}
	if lost != 1 {
		t.Errorf("%d tasks lost their slot, want 1 (the priority task's)", lost)
	}
	if held, err := l.HasSlot(ctx, req("otp", true)); err != nil || !held {
		t.Errorf("the priority task does not hold its slot: %v %v", held, err)
	}
}

// Weights of 2:1 give 2:1 slots while both tenants wait, and the slots
// stay one after another: a stride of 1.5 slots leaves no gap that no slot
// fits.
func TestFairShareWeightedSlots(t *testing.T) {
	l, _ := newStandalone(t)
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	type slot struct {
		at     time.Time
		tenant string
	}
	var slots []slot
	for i := range 40 {
		for _, tn := range []struct {
			name string
			w    int
		}{{"big", 2}, {"small", 1}} {
			r := bookReq(fmt.Sprint(tn.name, i), nil, "", b, 0)
			r.book.Tenant, r.book.Weight = tn.name, tn.w
			d := mustAdmit(t, l, r)
			slots = append(slots, slot{d.At(), tn.name})
		}
	}
	slices.SortFunc(slots, func(a, b slot) int { return a.at.Compare(b.at) })
	big := 0
	for i, s := range slots[:30] {
		if s.tenant == "big" {
			big++
		}
		if i > 0 {
			if gap := s.at.Sub(slots[i-1].at); gap != 100*time.Millisecond {
				t.Errorf("slot %d is %s after the one before: want the next slot (100ms)", i, gap)
			}
		}
	}
	if big < 19 || big > 21 {
		t.Errorf("big has %d of the first 30 slots with weights 2:1: want 20", big)
	}
}
