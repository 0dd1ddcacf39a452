package throttle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// newStandalone returns a Limiter and a client on a database of the test's
// own on the package's shared redis-server.
func newStandalone(t testing.TB) (*Limiter, *redis.Client) {
	t.Helper()
	rdb, _ := shared.NewClient(t)
	return mustLimiter(t, rdb), rdb
}

// newOwnServer starts a redis-server of the test's own and returns a Limiter
// and a client on it, for tests of what a server holds for all its databases
// (loaded functions, command counts of a whole test) and for child processes
// that reach the server by its address alone.
func newOwnServer(t testing.TB) (*Limiter, *redis.Client) {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	return mustLimiter(t, rdb), rdb
}

// newCluster starts a 3-master Redis Cluster of the test's own and returns a
// Limiter and a client on it.
func newCluster(t testing.TB) (*Limiter, *redis.ClusterClient) {
	t.Helper()
	rdb := redistest.StartCluster(t, 3, 0).Client(t)
	return mustLimiter(t, rdb), rdb
}

func mustLimiter(t testing.TB, rdb redis.UniversalClient) *Limiter {
	t.Helper()
	l, err := New(rdb, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

func mustQuota(t testing.TB, name string, ws ...Window) *Quota {
	t.Helper()
	q, err := NewQuota(name, ws...)
	if err != nil {
		t.Fatalf("NewQuota: %v", err)
	}
	return q
}

func mustBucket(t testing.TB, name string, rate float64, burst int) *Bucket {
	t.Helper()
	b, err := NewBucket(name, rate, burst)
	if err != nil {
		t.Fatalf("NewBucket: %v", err)
	}
	return b
}

func mustAdmit(t testing.TB, l *Limiter, r Request) Decision {
	t.Helper()
	d, err := l.Admit(context.Background(), r)
	if err != nil {
		t.Fatalf("Admit(%s): %v", r.ID, err)
	}
	return d
}

// snapshot returns every key with its type-specific content, so tests can
// assert that a call left Redis exactly as it was.
func snapshot(t testing.TB, rdb redis.UniversalClient) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var mu sync.Mutex // ForEachMaster runs its callbacks concurrently
	scan := func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			v, err := c.Dump(ctx, k).Result()
			if err != nil && err != redis.Nil {
				return err
			}
			mu.Lock()
			out[k] = v
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return out
}

// withWait returns r with MaxWait w: a bucket short of tokens for at most w
// reserves ahead.
func withWait(r Request, w time.Duration) Request {
	r.MaxWait = w
	return r
}

// booked is a request's booking: none (nil) unless book.
func booked(book bool) *Booking {
	if book {
		return &Booking{}
	}
	return nil
}

// horizon reports whether r books with a horizon.
func horizon(r Request) bool { return r.book != nil && r.book.Horizon > 0 }

// deadline is r's booking deadline as the script takes it: µs, 0 for none.
func deadline(r Request) int64 {
	if r.book == nil || r.book.Deadline.IsZero() {
		return 0
	}
	return max(1, r.book.Deadline.UnixMicro())
}
