package throttle

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestReweighScalesTheLines: tenants a and b, weight 1 each, wait in line
// on a 10/s bucket, each a place every 200 ms (half the rate). a's weight
// changed to 3: a's places after now close up by 2/3 (to 3/4 of the rate),
// b's spread out by 2 (1/4), both in order; a second call finds nothing to
// change; a new place of a's is a stride of the new weight after its last.
// Reweighed says a weight changed before the call, and none after it.
func TestReweighScalesTheLines(t *testing.T) {
	l, rdb := newStandalone(t)
	reweighScales(t, l, rdb)
}

// TestReweighOnACluster: the same on a 3-master Redis Cluster (the call
// runs on the bucket's slot, its keys all tagged with the subject).
func TestReweighOnACluster(t *testing.T) {
	l, rdb := newCluster(t)
	reweighScales(t, l, rdb)
}

// reweighScales is TestReweighScalesTheLines on l, whose Redis rdb is.
func reweighScales(t *testing.T, l *Limiter, rdb redis.Cmdable) {
	b := mustBucket(t, "sms", 10, 1) // a slot every 100 ms
	const ahead = 500 * time.Millisecond
	inLine := map[string]string{}
	var ids = map[string][]string{}
	for i := range 20 {
		for _, tn := range []string{"a", "b"} {
			id := fmt.Sprintf("%s%d", tn, i)
			if d := mustAdmit(t, l, lineReq(id, tn, 1, b, ahead)); d.Outcome == Placed {
				inLine[id] = tn
				ids[tn] = append(ids[tn], id)
			}
		}
	}
	if len(ids["a"]) < 15 || len(ids["b"]) < 15 {
		t.Fatalf("placed a %d, b %d of 20 each", len(ids["a"]), len(ids["b"]))
	}
	places := func(tn string) []int64 {
		var out []int64
		for _, id := range ids[tn] {
			p, ok := placeIn(t, rdb, b, id)
			if !ok {
				t.Fatalf("%s has no place", id)
			}
			out = append(out, p)
		}
		return out
	}
	before := map[string][]int64{"a": places("a"), "b": places("b")}
	if yes, err := l.Reweighed(ctx, b, "gw", map[string]int{"a": 1}); err != nil || yes {
		t.Fatalf("Reweighed at the weights recorded = %v, %v; want false", yes, err)
	}
	if yes, err := l.Reweighed(ctx, b, "gw", map[string]int{"a": 3}); err != nil || !yes {
		t.Fatalf("Reweighed with a's weight changed = %v, %v; want true", yes, err)
	}
	if p := places("a"); p[len(p)-1] != before["a"][len(p)-1] {
		t.Fatalf("Reweighed moved a's last place: %d, was %d; want it to write nothing", p[len(p)-1], before["a"][len(p)-1])
	}
	k, now, err := l.Reweigh(ctx, b, "gw", map[string]int{"a": 3}, inLine)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(k["a"]-2.0/3) > 1e-5 || math.Abs(k["b"]-2) > 1e-5 {
		t.Fatalf("factors %v, want a 2/3 and b 2", k)
	}
	for tn, want := range map[string]float64{"a": 2.0 / 3, "b": 2} {
		after := places(tn)
		for i, p := range after {
			moved := now.UnixMicro() + int64(math.Ceil(float64(before[tn][i]-now.UnixMicro())*want))
			if p != moved {
				t.Errorf("%s's place %d: %d, want %d (%d scaled by %.3f around %d)", tn, i, p, moved, before[tn][i], want, now.UnixMicro())
			}
			if i > 0 && p <= after[i-1] {
				t.Errorf("%s's places out of order: %d after %d", tn, p, after[i-1])
			}
		}
	}
	// Each record's expiry and the expiry set's score for it agree, so that
	// a tenant is not pruned from W while its line still lies ahead.
	tag := subjectTag(DefaultPrefix, "gw")
	for _, tn := range []string{"a", "b"} {
		rec, err := rdb.HGet(ctx, fairKey(tag, b.Name()), tn).Result()
		if err != nil {
			t.Fatal(err)
		}
		exp, err := rdb.ZScore(ctx, tenantsKey(tag, b.Name()), tn).Result()
		if err != nil {
			t.Fatal(err)
		}
		if parts := strings.Split(rec, ","); len(parts) != 4 || parts[3] != fmt.Sprint(int64(exp)) {
			t.Errorf("%s's record %q, its expiry in the set %d: want them equal", tn, rec, int64(exp))
		}
	}
	if k, _, err := l.Reweigh(ctx, b, "gw", map[string]int{"a": 3}, inLine); err != nil || k != nil {
		t.Errorf("a second call: %v, %v; want nothing changed", k, err)
	}
	if yes, err := l.Reweighed(ctx, b, "gw", map[string]int{"a": 3}); err != nil || yes {
		t.Errorf("Reweighed after the change = %v, %v; want false", yes, err)
	}
	last := places("a")[len(ids["a"])-1]
	d := mustAdmit(t, l, lineReq("a-new", "a", 3, b, ahead))
	// The stride of weight 3 among 4: 100 ms x 4 / 3.
	if d.Outcome != Placed || d.At().UnixMicro()-last != int64(math.Ceil(100_000*4.0/3)) {
		t.Errorf("a's next task: %+v (%d after its last place), want a place 133.334 ms after it", d, d.At().UnixMicro()-last)
	}
}

// TestMoversKeepTheTenantsKeysAlive: a mover that moves the tenants'
// expiries later (a cut rate, a tenant's line spread out by others'
// weights, a pause) makes the tenants hash and the expiry set live as long
// as the longest wait they then hold, as fair_write does; else they expire
// with tenants still in line, and W, the join cursor and the lines' ends go
// with them.
func TestMoversKeepTheTenantsKeysAlive(t *testing.T) {
	fast, slow := mustBucket(t, "sms", 10, 1), mustBucket(t, "sms", 2, 1)
	for name, move := range map[string]func(*Limiter) error{
		"repace": func(l *Limiter) error { _, _, err := l.Repace(ctx, slow, "gw"); return err },
		"reweigh": func(l *Limiter) error {
			_, _, err := l.Reweigh(ctx, fast, "gw", map[string]int{"a": 4}, nil)
			return err
		},
		"pause": func(l *Limiter) error { _, err := l.Pause(ctx, fast, "gw", 3*time.Second); return err },
	} {
		t.Run(name, func(t *testing.T) {
			l, rdb := newStandalone(t)
			if _, _, err := l.Repace(ctx, fast, "gw"); err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				for _, tn := range []string{"a", "b"} {
					mustAdmit(t, l, lineReq(fmt.Sprintf("%s%d", tn, i), tn, 1, fast, 300*time.Millisecond))
				}
			}
			if err := move(l); err != nil {
				t.Fatal(err)
			}
			tag := subjectTag(DefaultPrefix, "gw")
			fair, exp := fairKey(tag, fast.Name()), tenantsKey(tag, fast.Name())
			recs, err := rdb.HGetAll(ctx, fair).Result()
			if err != nil {
				t.Fatal(err)
			}
			last := int64(0)
			for tn, rec := range recs {
				if parts := strings.Split(rec, ","); len(parts) == 4 && (tn == "a" || tn == "b") {
					e, _ := strconv.ParseInt(parts[3], 10, 64)
					last = max(last, e)
				}
			}
			for _, key := range []string{fair, exp} {
				if deadline := rdb.PExpireTime(ctx, key).Val(); deadline.Milliseconds()*1000 < last {
					t.Errorf("%s expires at %d ms, before the last tenant's wait ends (%d µs)", key, deadline.Milliseconds(), last)
				}
			}
		})
	}
}
