package throttle

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
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
	lasts := map[string]time.Time{} // each tenant's last place, as its tasks were told
	for i := range 20 {
		for _, tn := range []string{"a", "b"} {
			if d := mustAdmit(t, l, lineReq(fmt.Sprintf("%s%d", tn, i), tn, 1, b, ahead)); d.Outcome == Placed {
				lasts[tn] = d.At()
			}
		}
	}
	if lasts["a"].IsZero() || lasts["b"].IsZero() {
		t.Fatalf("a and b were not both placed in line: %v", lasts)
	}
	tag := keyspace.Tag(DefaultPrefix, "gw")
	record := func(tn string) []string {
		rec, err := rdb.HGet(ctx, keyspace.Fair(tag, b.Name()), tn).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(rec, ",")
	}
	for tn, last := range lasts {
		if got := record(tn)[0]; got != fmt.Sprint(last.UnixMicro()) {
			t.Fatalf("%s's record holds its last place %s, want the last it gave, %d", tn, got, last.UnixMicro())
		}
	}
	if yes, err := l.Reweighed(ctx, b, "gw", map[string]int{"a": 1}); err != nil || yes {
		t.Fatalf("Reweighed at the weights recorded = %v, %v; want false", yes, err)
	}
	if yes, err := l.Reweighed(ctx, b, "gw", map[string]int{"a": 3}); err != nil || !yes {
		t.Fatalf("Reweighed with a's weight changed = %v, %v; want true", yes, err)
	}
	if got := record("a")[0]; got != fmt.Sprint(lasts["a"].UnixMicro()) {
		t.Fatalf("Reweighed moved a's last place: %s, was %d; want it to write nothing", got, lasts["a"].UnixMicro())
	}
	k, now, err := l.Reweigh(ctx, b, "gw", map[string]int{"a": 3, "b": 1})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(k["a"]-2.0/3) > 1e-5 || math.Abs(k["b"]-2) > 1e-5 {
		t.Fatalf("factors %v, want a 2/3 and b 2", k)
	}
	for tn, want := range map[string]float64{"a": 2.0 / 3, "b": 2} {
		moved := now.UnixMicro() + int64(math.Ceil(float64(lasts[tn].UnixMicro()-now.UnixMicro())*want))
		if got := record(tn)[0]; got != fmt.Sprint(moved) {
			t.Errorf("%s's last place: %s, want %d (%d scaled by %.3f around %d)", tn, got, moved, lasts[tn].UnixMicro(), want, now.UnixMicro())
		}
	}
	// Each record's expiry and the expiry set's score for it agree, so that
	// a tenant is not pruned from W while its line still lies ahead.
	for _, tn := range []string{"a", "b"} {
		exp, err := rdb.ZScore(ctx, keyspace.Tenants(tag, b.Name()), tn).Result()
		if err != nil {
			t.Fatal(err)
		}
		if parts := record(tn); len(parts) != 4 || parts[3] != fmt.Sprint(int64(exp)) {
			t.Errorf("%s's record %q, its expiry in the set %d: want them equal", tn, parts, int64(exp))
		}
	}
	if k, _, err := l.Reweigh(ctx, b, "gw", map[string]int{"a": 3, "b": 1}); err != nil || k != nil {
		t.Errorf("a second call: %v, %v; want nothing changed", k, err)
	}
	if yes, err := l.Reweighed(ctx, b, "gw", map[string]int{"a": 3}); err != nil || yes {
		t.Errorf("Reweighed after the change = %v, %v; want false", yes, err)
	}
	last, _ := strconv.ParseInt(record("a")[0], 10, 64)
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
			_, _, err := l.Reweigh(ctx, fast, "gw", map[string]int{"a": 4})
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
			tag := keyspace.Tag(DefaultPrefix, "gw")
			fair, exp := keyspace.Fair(tag, fast.Name()), keyspace.Tenants(tag, fast.Name())
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
