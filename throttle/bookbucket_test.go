package throttle

import (
	"slices"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// A booked task admitted for a moment later than the bucket needs (its
// recipient's window sets it) takes its token for that moment: the bucket
// does not refill past its burst before then and hand the token out again.
// Seen in the priority benchmark: granted moments burst + 2 over the bucket.
//
// It failed before the bucket kept r, the latest moment granted ahead: a
// take counted its tokens at once and the bucket refilled to its burst
// before the take's moment, handing them out again.
func TestBookLaterMomentKeepsTheBucket(t *testing.T) {
	l, rdb := newStandalone(t)
	b := mustBucket(t, "gw", 2, 2) // a token every 500 ms, 2 at most
	q := mustQuota(t, "p", Window{1, 1500 * time.Millisecond})
	const maxWait = 2 * time.Second
	// p0 goes now; a, to the same recipient, is admitted for p0's moment +
	// 1.5 s (within max wait) while the bucket still holds a token.
	p0 := mustAdmit(t, l, bookReq("p0", q, "alice", b, maxWait))
	a := mustAdmit(t, l, bookReq("a", q, "alice", b, maxWait))
	if !p0.Allowed() || !a.Allowed() || a.Delay < time.Second {
		t.Fatalf("p0 %+v, a %+v: want p0 now and a admitted 1.5 s later", p0, a)
	}
	// At a's moment two others, to other recipients, ask for the provider.
	untilRedis(t, l, a.At())
	for _, id := range []string{"b", "c"} {
		mustAdmit(t, l, bookReq(id, q, id, b, 0))
	}
	var at []time.Time
	for _, v := range ledger(t, rdb, keyspace.Tag(DefaultPrefix, "gw"), "gw") {
		at = append(at, time.UnixMicro(v))
	}
	slices.SortFunc(at, time.Time.Compare)
	// Every interval [at[i], at[j]] holds at most burst + rate·(at[j]-at[i]).
	for i := range at {
		for j := i; j < len(at); j++ {
			if n, allow := float64(j-i+1), 2+2*at[j].Sub(at[i]).Seconds(); n > allow+1e-6 {
				t.Errorf("granted %d tokens within %s (from %s): the bucket (2/s, burst 2) allows %.2f; ledger %v",
					j-i+1, at[j].Sub(at[i]), at[i].Format("15:04:05.000000"), allow, at)
			}
		}
	}
}
