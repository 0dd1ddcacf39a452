//go:build integration

package throttle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// On a cluster a recipient's quota and a provider's bucket live on
// different nodes; a booking takes both into account, as on one node.
func TestClusterBooking(t *testing.T) {
	l, rdb := newCluster(t)
	ctx := context.Background()
	q := mustQuota(t, "p", Window{1, time.Second}, Window{2, 10 * time.Second})
	b := mustBucket(t, "sms", 5, 1)
	if s1, s2 := keySlot(t, rdb, keyspace.Quota(keyspace.Tag(DefaultPrefix, "alice"), "p")), keySlot(t, rdb, keyspace.Bucket(keyspace.Tag(DefaultPrefix, "gw"), "sms")); s1 == s2 {
		t.Fatalf("the quota and the bucket share slot %d: the test needs them apart", s1)
	}
	const maxWait = 100 * time.Millisecond

	// The provider's line: one slot (200 ms) apart, in order.
	var booked []Decision
	for i := range 8 {
		d := mustAdmit(t, l, bookReq(fmt.Sprint("p", i), q, fmt.Sprint("r", i), b, maxWait))
		if d.Booked() {
			booked = append(booked, d)
		} else if !d.Allowed() {
			t.Fatalf("p%d: %+v", i, d)
		}
	}
	if len(booked) < 5 {
		t.Fatalf("%d of 8 booked at 5/s burst 1", len(booked))
	}
	for i := 1; i < len(booked); i++ {
		// Each node has its own clock, here the same host's.
		if gap := booked[i].At().Sub(booked[i-1].At()); gap < 200*time.Millisecond-time.Millisecond || gap > 200*time.Millisecond+2*time.Millisecond {
			t.Errorf("booking %d is %s after the one before, want one slot (200ms)", i, gap)
		}
		if _, ok := booked[i].Rule.(*Bucket); !ok {
			t.Errorf("booking %d bound by %v, want the bucket", i, booked[i].Rule)
		}
	}

	// A recipient's messages: its windows decide, counting its bookings.
	a0 := mustAdmit(t, l, bookReq("a0", q, "alice", b, maxWait))
	a1 := mustAdmit(t, l, bookReq("a1", q, "alice", b, maxWait))
	a2 := mustAdmit(t, l, bookReq("a2", q, "alice", b, maxWait))
	if !a1.Booked() || !a2.Booked() {
		t.Fatalf("alice: %+v / %+v / %+v", a0, a1, a2)
	}
	if _, ok := a2.Rule.(*Quota); !ok || a2.Limit != "2 per 10s" {
		t.Errorf("alice's third bound by %v (%q), want her 10s window", a2.Rule, a2.Limit)
	}
	if got := a2.At().Sub(a0.At()); got < 10*time.Second-2*time.Millisecond {
		t.Errorf("alice's third is %s after her first, want her 10s window", got)
	}

	// Coming back early (further ahead than a booked task may claim: 2.5 s)
	// changes nothing; at the moment, the claim goes.
	before := snapshot(t, rdb)
	if e := mustAdmit(t, l, bookReq("a2", q, "alice", b, maxWait)); !e.Booked() || !e.At().Equal(a2.At()) {
		t.Errorf("early return: %+v, want the same moment %s", e, a2.At())
	}
	if after := snapshot(t, rdb); len(before) != len(after) {
		t.Errorf("an early return changed the keys: %d -> %d", len(before), len(after))
	}
	first := booked[0]
	id := fmt.Sprint("p", 8-len(booked))
	untilRedis(t, l, first.At().Add(-maxWait/2))
	c := mustAdmit(t, l, bookReq(id, q, fmt.Sprint("r", 8-len(booked)), b, maxWait))
	if !c.Allowed() || c.At().Before(first.At()) || c.Claimed.IsZero() {
		t.Fatalf("claim of %s at its moment: %+v", id, c)
	}
	if _, err := rdb.ZScore(ctx, keyspace.Book(keyspace.Tag(DefaultPrefix, "gw"), "sms"), id).Result(); err == nil {
		t.Errorf("a claimed ticket is still there")
	}

	// A deadline before the moment: nothing is held, on either node.
	before = snapshot(t, rdb)
	r := bookReq("late", q, "alice", b, maxWait)
	r.book.Deadline = time.Now().Add(time.Second)
	if d := mustAdmit(t, l, r); d.Outcome != Expired {
		t.Errorf("a booking past its deadline: %+v", d)
	}
	if after := snapshot(t, rdb); len(before) != len(after) {
		t.Errorf("an expired booking left keys: %d -> %d", len(before), len(after))
	}

	// Release gives the booking back on both nodes.
	if n, err := l.Release(ctx, bookReq("a2", q, "alice", b, maxWait)); err != nil || n != 2 {
		t.Errorf("Release(a2) = %d, %v; want its quota entry and its ticket", n, err)
	}
}

// On a cluster the horizon and the tenants' shares hold as on one node.
func TestClusterBookAheadAndShares(t *testing.T) {
	l, _ := newCluster(t)
	b := mustBucket(t, "sms", 10, 1)
	const ahead = time.Second
	var queued []Decision
	for i := range 30 {
		id := fmt.Sprint("big", i)
		d := mustAdmit(t, l, lineReq(id, "big", 1, b, ahead))
		if d.Booked() && d.Outcome != Placed && d.Delay > ahead {
			t.Errorf("%s booked %s ahead: past the horizon", id, d.Delay)
		}
		if d.Outcome == Placed {
			queued = append(queued, d)
		}
	}
	if len(queued) < 15 {
		t.Fatalf("%d of 30 placed in line", len(queued))
	}
	var small []time.Time
	for i := range 5 {
		d := mustAdmit(t, l, lineReq(fmt.Sprint("small", i), "small", 1, b, ahead))
		small = append(small, d.At())
	}
	for i := 2; i < len(small); i++ {
		if gap := small[i].Sub(small[i-1]); gap != 200*time.Millisecond {
			t.Errorf("small's place %d is %s after the one before: want 2 slots (its half)", i, gap)
		}
	}
	if last := queued[len(queued)-1].At(); !small[4].Before(last) {
		t.Errorf("small's 5th at %s, not before big's last place %s: no share", small[4], last)
	}
}

// TestClusterLineWithQuotas: bookings whose recipients' quotas live on
// other nodes than the bucket keep to the horizon and the tenants' shares
// as on one node: past the horizon the bucket's call gives a place in line
// (nothing taken from the quotas, whose node is not asked), and a tenant
// that starts waiting behind another's line gets its share at once.
func TestClusterLineWithQuotas(t *testing.T) {
	l, rdb := newCluster(t)
	ctx := context.Background()
	q := mustQuota(t, "p", Window{5, time.Second})
	b := mustBucket(t, "sms", 10, 1)
	const ahead = time.Second
	req := func(id, tenant string) Request {
		r := lineReq(id, tenant, 1, b, ahead)
		r.Takes = append([]Take{{Rule: q, Subject: "rcpt-" + id}}, r.Takes...)
		return r
	}
	if s1, s2 := keySlot(t, rdb, keyspace.Quota(keyspace.Tag(DefaultPrefix, "rcpt-big0"), "p")), keySlot(t, rdb, keyspace.Bucket(keyspace.Tag(DefaultPrefix, "gw"), "sms")); s1 == s2 {
		t.Fatalf("the quota and the bucket share slot %d: the test needs them apart", s1)
	}
	var queued []Decision
	for i := range 30 {
		id := fmt.Sprint("big", i)
		d := mustAdmit(t, l, req(id, "big"))
		if d.Booked() && d.Outcome != Placed && d.Delay > ahead+100*time.Millisecond {
			t.Errorf("%s booked %s ahead: past the horizon", id, d.Delay)
		}
		if d.Outcome != Placed {
			continue
		}
		queued = append(queued, d)
		if n, err := rdb.Exists(ctx, keyspace.Quota(keyspace.Tag(DefaultPrefix, "rcpt-"+id), "p")).Result(); err != nil || n != 0 {
			t.Errorf("%s is in line but its recipient's quota holds an entry (%d, %v)", id, n, err)
		}
		if _, ok := d.Rule.(*Bucket); !ok {
			t.Errorf("%s in line, bound by %v: want the bucket", id, d.Rule)
		}
	}
	if len(queued) < 15 {
		t.Fatalf("%d of 30 placed in line", len(queued))
	}
	for i := 1; i < len(queued); i++ {
		if gap := queued[i].At().Sub(queued[i-1].At()); gap != 100*time.Millisecond {
			t.Errorf("place %d is %s after the one before: want one slot (100ms)", i, gap)
		}
	}
	last := queued[len(queued)-1]
	var small []time.Time
	for i := range 5 {
		d := mustAdmit(t, l, req(fmt.Sprint("small", i), "small"))
		small = append(small, d.At())
	}
	for i := 2; i < len(small); i++ {
		if gap := small[i].Sub(small[i-1]); gap != 200*time.Millisecond {
			t.Errorf("small's place %d is %s after the one before: want 2 slots (its half)", i, gap)
		}
	}
	if !small[4].Before(last.At()) {
		t.Errorf("small's 5th at %s, not before big's last place %s: no share", small[4], last.At())
	}

	// Back at its place, with the calendar free there: it goes, its
	// quotas' entries written at the bucket's moment.
	free := mustBucket(t, "idle", 10, 1)
	back := backFrom(lineReq("back", "big", 1, free, ahead))
	back.Takes = append([]Take{{Rule: q, Subject: "rcpt-back"}}, back.Takes...)
	if d := mustAdmit(t, l, back); !d.Allowed() || d.Delay > clusterSkew {
		t.Errorf("back at its place: %s, want admitted now", describeDecision(d))
	}
	if n, err := rdb.ZCard(ctx, keyspace.Quota(keyspace.Tag(DefaultPrefix, "rcpt-back"), "p")).Result(); err != nil || n != 1 {
		t.Errorf("back went, its recipient's quota holds %d entries (%v), want 1", n, err)
	}
}

// TestClusterBacklogBooksInsteadOfSleeping: on a cluster as on one node,
// while work the caller has not seen waits (Request.Backlog), a fresh task
// whose moment is a little ahead books it rather than going to sleep in
// its worker for it; without a backlog it goes, told to wait.
func TestClusterBacklogBooksInsteadOfSleeping(t *testing.T) {
	l, _ := newCluster(t)
	q := mustQuota(t, "p", Window{10, time.Second})
	b := mustBucket(t, "sms", 4, 1) // a slot every 250 ms
	req := func(id string, backlog bool) Request {
		r := bookReq(id, q, "r-"+id, b, 2*time.Second)
		r.book.Horizon, r.book.Backlog = 5*time.Second, backlog
		return r
	}
	if d := mustAdmit(t, l, req("first", false)); !d.Allowed() {
		t.Fatalf("first: %+v, want admitted", d)
	}
	if d := mustAdmit(t, l, req("quiet", false)); !d.Allowed() || d.Delay <= 0 {
		t.Errorf("no backlog: %+v, want admitted with a wait for its slot", d)
	}
	d := mustAdmit(t, l, req("busy", true))
	if d.Outcome != Booked || d.Delay <= 0 {
		t.Errorf("a backlog behind it: %+v, want booked", d)
	}
	// Back for its moment, it claims it and goes (it waited its turn).
	untilRedis(t, l, d.At().Add(-time.Second))
	if again := mustAdmit(t, l, req("busy", true)); !again.Allowed() {
		t.Errorf("back for its booking: %+v, want admitted", again)
	}
}

// A task back from its place that finds the calendar behind its line by
// more than its max wait but less than CLAIM takes the slot, and keeps its
// order: placed again, it would go to its line's end. It sleeps for the
// slot (sleep_limit), on a cluster as on one node.
func TestBackFromPlaceKeepsItsSlot(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(testing.TB) (*Limiter, redis.UniversalClient)
		want Outcome
	}{
		{"standalone", func(t testing.TB) (*Limiter, redis.UniversalClient) { return newStandalone(t) }, Admitted},
		{"cluster", func(t testing.TB) (*Limiter, redis.UniversalClient) { return newCluster(t) }, Admitted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := tc.new(t)
			b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
			for i := range 15 {
				if d := mustAdmit(t, l, lineReq(fmt.Sprint("t", i), "acme", 1, b, 5*time.Second)); !d.Allowed() && !d.Booked() {
					t.Fatalf("t%d: %+v", i, d)
				}
			}
			// With a recipient's quota, on its own node on a cluster.
			r := bookReq("back", mustQuota(t, "p", Window{100, time.Hour}), "alice", b, 500*time.Millisecond)
			r.book.Tenant, r.book.Weight, r.book.Horizon, r.book.Back = "acme", 1, 5*time.Second, true
			d := mustAdmit(t, l, r)
			if d.Outcome != tc.want || d.Delay < time.Second || d.Delay > 2500*time.Millisecond {
				t.Errorf("back at its place, the calendar 1.5 s behind: %+v; want %s, about 1.5 s ahead", d, tc.want)
			}
		})
	}
}
