package jobs

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/throttle"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now(context.Context) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func mustBucket(t *testing.T, name string) *throttle.Bucket {
	t.Helper()
	b, err := throttle.NewBucket(name, 10, 5)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSendCountsFlush: the sends counted are written to each bucket's state
// hash in the bin of the moment they were sent, the hash lives the bins
// kept and 6 more after its newest (never less than it did: a pause's end
// lives in it too), a bin that leaves the kept ones is dropped, and a
// bucket with no sends since the last write is not written.
func TestSendCountsFlush(t *testing.T) {
	ctx := context.Background()
	rdb, _ := shared.NewClient(t)
	clock := &fakeClock{t: time.Now()}
	s := NewSendCounts(rdb, "throttle:", clock.now)
	sms, mail := mustBucket(t, "sms"), mustBucket(t, "mail")
	smsKey := keyspace.Bucket(keyspace.Tag("throttle:", "twilio"), "sms")
	mailKey := keyspace.Bucket(keyspace.Tag("throttle:", "ses"), "mail")
	bin := keyspace.SentBinOf(clock.t)
	field := func(b int64) string { return strconv.FormatInt(b, 10) }

	// An old bin, the one the next bin's write drops, and a pause on mail.
	old := bin - keyspace.SentBins + 1
	rdb.HSet(ctx, smsKey, field(old), 7)
	rdb.HSet(ctx, mailKey, keyspace.PauseField, 1)
	rdb.PExpire(ctx, mailKey, time.Hour)

	s.Add(ctx, sms, "twilio", 1)
	s.Add(ctx, sms, "twilio", 2)
	s.Add(ctx, mail, "ses", 1)
	s.Add(ctx, nil, "none", 1) // a route without a bucket counts nothing
	clock.set(clock.t.Add(keyspace.SentBin * time.Microsecond))
	s.Add(ctx, sms, "twilio", 4)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := rdb.HGetAll(ctx, smsKey).Val()
	if len(got) != 2 || got[field(bin)] != "3" || got[field(bin+1)] != "4" {
		t.Errorf("sms's hash %v, want 3 in bin %d and 4 in the next, bin %d dropped", got, bin, old)
	}
	life := time.Duration(keyspace.SentBins+6) * keyspace.SentBin * time.Microsecond
	if ttl := rdb.PTTL(ctx, smsKey).Val(); ttl < life-keyspace.SentBin*time.Microsecond || ttl > life+keyspace.SentBin*time.Microsecond {
		t.Errorf("sms's hash lives %s, want about %s", ttl, life)
	}
	if got := rdb.HGet(ctx, mailKey, field(bin)).Val(); got != "1" {
		t.Errorf("mail's bin %d = %q, want 1", bin, got)
	}
	if ttl := rdb.PTTL(ctx, mailKey).Val(); ttl < 59*time.Minute {
		t.Errorf("mail's hash lives %s after the write, want the hour its pause set", ttl)
	}
	if keys := rdb.Keys(ctx, "*none*").Val(); len(keys) != 0 {
		t.Errorf("keys %q for a route without a bucket", keys)
	}

	// Nothing sent since: nothing written.
	rdb.Del(ctx, mailKey)
	s.Add(ctx, sms, "twilio", 1)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, mailKey).Val(); n != 0 {
		t.Errorf("mail's hash written again with no sends since the last write")
	}
	if got := rdb.HGet(ctx, smsKey, field(bin+1)).Val(); got != "5" {
		t.Errorf("sms's bin %d = %q after one more send, want 5", bin+1, got)
	}
}

// TestSendCountsKeptOnError: a write that fails keeps its counts for the
// next one.
func TestSendCountsKeptOnError(t *testing.T) {
	ctx := context.Background()
	rdb, _ := shared.NewClient(t)
	s := NewSendCounts(rdb, "throttle:", nil)
	s.Add(ctx, mustBucket(t, "sms"), "twilio", 2)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Flush(cancelled); err == nil {
		t.Fatal("a write under a cancelled context succeeded")
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	key := keyspace.Bucket(keyspace.Tag("throttle:", "twilio"), "sms")
	if got := rdb.HGetAll(ctx, key).Val(); len(got) != 1 {
		t.Errorf("the hash after a failed write then one that passed = %v, want the 2 sends in one bin", got)
	} else {
		for _, v := range got {
			if v != "2" {
				t.Errorf("the hash after a failed write then one that passed = %v, want the 2 sends in one bin", got)
			}
		}
	}
}

// TestSendCountsRun: Run writes the counts within a second of the sends,
// and once more when its context ends.
func TestSendCountsRun(t *testing.T) {
	ctx := context.Background()
	rdb, _ := shared.NewClient(t)
	s := NewSendCounts(rdb, "throttle:", nil)
	sms := mustBucket(t, "sms")
	key := keyspace.Bucket(keyspace.Tag("throttle:", "twilio"), "sms")
	total := func() (n int) {
		for _, v := range rdb.HGetAll(ctx, key).Val() {
			c, _ := strconv.Atoi(v)
			n += c
		}
		return n
	}
	run, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(run) }()
	s.Add(ctx, sms, "twilio", 1)
	for deadline := time.Now().Add(5 * time.Second); total() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sends written %d, want the one sent, within a second or so", total())
		}
	}
	s.Add(ctx, sms, "twilio", 1)
	stop()
	<-done
	if n := total(); n != 2 {
		t.Errorf("sends written %d once Run returned, want both", n)
	}
}
