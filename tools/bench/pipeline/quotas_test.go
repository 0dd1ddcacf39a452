package pipeline

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// quotaWatch records the moment of every entry of some recipients' quota
// sets (policy marketing) while a benchmark runs: the moments their windows
// were checked at. The sets cannot say it at the end: a set keeps an entry
// only until a later write to it finds it out of every window (10 s), and
// the ledger's slot start is not the moment (that is anywhere from the
// slot less the slack to the slot: x = max(quotas' moment, V - slack)).
// An entry's last moment stays in its set for at least the longest window
// after it, so reading every set each quotaPoll misses none.
type quotaWatch struct {
	rdb  *redis.Client
	keys []string
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	at   map[string]time.Time // task ID -> its entry's last moment
	err  error
}

const quotaPoll = 500 * time.Millisecond

func watchQuotas(rdb *redis.Client, recipients []string) *quotaWatch {
	w := &quotaWatch{rdb: rdb, stop: make(chan struct{}), done: make(chan struct{}), at: map[string]time.Time{}}
	for _, r := range recipients {
		w.keys = append(w.keys, "throttle:{"+r+"}:q:marketing")
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(quotaPoll)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
				w.read(context.Background())
			}
		}
	}()
	return w
}

// read reads every set once, in one round trip.
func (w *quotaWatch) read(ctx context.Context) {
	cmds := make([]*redis.ZSliceCmd, len(w.keys))
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range w.keys {
			cmds[i] = p.ZRangeWithScores(ctx, k, 0, -1)
		}
		return nil
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.err = err
		return
	}
	for _, c := range cmds {
		for _, z := range c.Val() {
			id, _, _ := strings.Cut(fmt.Sprint(z.Member), "\x1f")
			w.at[id] = time.UnixMicro(int64(z.Score))
		}
	}
}

// moments stops the watch, reads the sets once more and returns every
// task's last moment.
func (w *quotaWatch) moments(ctx context.Context) (map[string]time.Time, error) {
	close(w.stop)
	<-w.done
	w.read(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at, w.err
}

// An entry a later write pruned from its set keeps the moment the watch
// last read; a moved one, its new moment. (Read at the end, the set no
// longer holds the first: BenchmarkRecipientBurst then took the ledger's
// slot less a fixed slack for it, a few ms off where the slot was not the
// moment, and stopped on windows the entries never broke.)
func TestQuotaWatchKeepsPrunedEntries(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	key := "throttle:{r@example.com}:q:marketing"
	at := func(us int64) time.Time { return time.UnixMicro(us) }
	rdb.ZAdd(ctx, key, redis.Z{Score: 1_000_000, Member: "a"}, redis.Z{Score: 3_000_000, Member: "b"},
		redis.Z{Score: 3_000_000, Member: "b\x1f2"})
	w := watchQuotas(rdb, []string{"r@example.com"})
	w.read(ctx)
	// a is pruned by a later write, b (of cost 2) moves, c is booked.
	rdb.ZRem(ctx, key, "a")
	rdb.ZAdd(ctx, key, redis.Z{Score: 3_002_000, Member: "b"}, redis.Z{Score: 3_002_000, Member: "b\x1f2"})
	rdb.ZAdd(ctx, key, redis.Z{Score: 5_002_000, Member: "c"})
	got, err := w.moments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Time{"a": at(1_000_000), "b": at(3_002_000), "c": at(5_002_000)}
	if len(got) != len(want) {
		t.Errorf("moments: %v, want %v", got, want)
	}
	for id, m := range want {
		if !got[id].Equal(m) {
			t.Errorf("%s: %v, want %v", id, got[id], m)
		}
	}
}
