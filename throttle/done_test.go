//go:build integration

package throttle

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// doneDance checks Request.CheckDone on l: a request whose marker is absent is
// admitted as usual; once the marker exists, the task is done: it takes
// nothing, even where its takes would deny or it holds them, and live
// requests among done ones are decided as if the done ones were not there.
func doneDance(t *testing.T, l *Limiter, rdb redis.UniversalClient, snap bool) {
	t.Helper()
	q := mustQuota(t, "mkt", Window{1, time.Hour})
	b := mustBucket(t, "sms", 0.001, 2)
	req := func(id, recipient string) Request {
		return Request{ID: id, CheckDone: true, Takes: []Take{{Rule: q, Subject: recipient}, {Rule: b, Subject: "gw"}}}
	}
	if d := mustAdmit(t, l, req("a", "alice")); !d.Allowed() || d.Outcome == Done {
		t.Fatalf("a, no marker: %+v, want admitted", d)
	}
	for _, id := range []string{"a", "x"} {
		if err := l.MarkDone(ctx, id, time.Now(), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var before map[string]string
	if snap {
		before = snapshot(t, rdb)
	}
	// "a" holds its takes; "x" would be denied by alice's quota.
	for _, r := range []Request{req("a", "alice"), req("x", "alice")} {
		d := mustAdmit(t, l, r)
		if d.Outcome != Done || d.Allowed() || d.TakeIndex != -1 || !errors.Is(d.Err(), ErrDone) {
			t.Errorf("%s, marker set: %+v (err %v), want done", r.ID, d, d.Err())
		}
	}
	if snap {
		if after := snapshot(t, rdb); !equalMaps(before, after) {
			t.Errorf("done admissions changed Redis:\nbefore %v\nafter  %v", before, after)
		}
	}
	// Done, live (bob), done, live (carol), live (alice: denied).
	rs := []Request{req("x", "bob"), req("b", "bob"), req("a", "carol"), req("c", "carol"), req("y", "alice")}
	ds := make([]Decision, len(rs))
	for i, r := range rs {
		ds[i] = mustAdmit(t, l, r)
	}
	want := []struct{ done, allowed bool }{{true, false}, {false, true}, {true, false}, {false, false}, {false, false}}
	for i, w := range want {
		if (ds[i].Outcome == Done) != w.done || ds[i].Allowed() != w.allowed {
			t.Errorf("%s for %s: %+v, want done %t, allowed %t", rs[i].ID, rs[i].Takes[0].Subject, ds[i], w.done, w.allowed)
		}
	}
	// c was denied by the bucket (b took its second token), y by alice's quota.
	if ds[3].TakeIndex != 1 || ds[4].TakeIndex != 0 {
		t.Errorf("denials by take %d and %d, want the bucket (1) and the quota (0)", ds[3].TakeIndex, ds[4].TakeIndex)
	}
	// Release ignores the marker: a's takes are given back.
	if n, err := l.Release(ctx, req("a", "alice")); n != 2 || err != nil {
		t.Errorf("release a: %d, %v; want both takes back", n, err)
	}
}

func TestDoneMarkerTakesNothing(t *testing.T) {
	l, rdb := newOwnServer(t)
	doneDance(t, l, rdb, true)
	if n := commandCalls(t, rdb)["exists"]; n == 0 {
		t.Errorf("no EXISTS ran inside the scripts: the marker was not checked")
	}
}

func TestDoneMarkerOnTheEmbeddedServer(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	doneDance(t, mustLimiter(t, rdb), rdb, false)
}

func TestClusterDoneMarker(t *testing.T) {
	l, rdb := newCluster(t)
	doneDance(t, l, rdb, false)
}

// TestDoneIfHeld: with DoneIfHeld, the marker is looked for only where the
// first take, a quota, finds the task holding its entry. A task holding
// its entry and marked is done, changing nothing; a new task makes no look
// at all (no EXISTS runs), which is why a marker set without an admission
// (which the caller promises never happens) goes unseen.
func TestDoneIfHeld(t *testing.T) {
	l, rdb := newOwnServer(t)
	q := mustQuota(t, "mkt", Window{2, time.Hour})
	b := mustBucket(t, "sms", 100, 10)
	req := func(id string) Request {
		return Request{ID: id, CheckDone: true, DoneIfHeld: true, Takes: []Take{{Rule: q, Subject: "alice"}, {Rule: b, Subject: "gw"}}}
	}
	if err := l.MarkDone(ctx, "unseen", time.Now(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := mustAdmit(t, l, req("unseen")); d.Outcome != Admitted {
		t.Fatalf("a new task: %+v, want admitted without a look at its marker", d)
	}
	if n := commandCalls(t, rdb)["exists"]; n != 0 {
		t.Errorf("%d EXISTS ran for a task that held nothing, want none", n)
	}
	if d := mustAdmit(t, l, req("a")); d.Outcome != Admitted {
		t.Fatalf("a: %+v, want admitted", d)
	}
	if err := l.MarkDone(ctx, "a", time.Now(), time.Minute); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, rdb)
	if d := mustAdmit(t, l, req("a")); d.Outcome != Done || d.Allowed() {
		t.Errorf("a, holding its entry and marked: %+v, want done", d)
	}
	if after := snapshot(t, rdb); !equalMaps(before, after) {
		t.Errorf("a done admission changed Redis:\nbefore %v\nafter  %v", before, after)
	}
	if n := commandCalls(t, rdb)["exists"]; n != 1 {
		t.Errorf("%d EXISTS ran, want the one look of a's second admission", n)
	}
}
