package throttle

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// TestSentCountsReachTheirBins: sends counted by Sent reach the bucket's
// sends hash, in the bin of Redis's clock, within about a second while
// CountSends runs, and the rest when it stops; the hash lives the bins it
// keeps and no longer.
func TestSentCountsReachTheirBins(t *testing.T) {
	t.Parallel()
	l, rdb := newStandalone(t)
	b := mustBucket(t, "sms", 10, 5)
	key := keyspace.Sent(keyspace.Tag(DefaultPrefix, "gw"), "sms")
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.CountSends(ctx) }()
	sum := func() (n int64) {
		for _, v := range rdb.HGetAll(context.Background(), key).Val() {
			c, _ := strconv.ParseInt(v, 10, 64)
			n += c
		}
		return n
	}
	l.Sent(b, "gw", 1)
	l.Sent(b, "gw", 2)
	deadline := time.Now().Add(10 * time.Second)
	for sum() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("sends hash holds %d after 10 s, want the 3 tokens sent", sum())
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.Sent(b, "gw", 1)
	stop()
	<-done
	if n := sum(); n != 4 {
		t.Errorf("sends hash holds %d once CountSends stopped, want 4: the last count written as it stops", n)
	}
	now := redisNow(t, l)
	bin := strconv.FormatInt(now.UnixMicro()/keyspace.SentBin, 10)
	prev := strconv.FormatInt(now.UnixMicro()/keyspace.SentBin-1, 10)
	for f := range rdb.HGetAll(context.Background(), key).Val() {
		if f != bin && f != prev {
			t.Errorf("field %q, want the bin of now (%s) or the one before", f, bin)
		}
	}
	if ttl := rdb.PTTL(context.Background(), key).Val(); ttl <= 0 || ttl > time.Duration(keyspace.SentBins+1)*keyspace.SentBin*time.Microsecond {
		t.Errorf("sends hash PTTL %s, want it to expire after the %d bins it keeps", ttl, keyspace.SentBins)
	}
}
