package dashboard

import (
	"context"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// The only code of the dashboard that knows the engine's layout
// (internal/keyspace's). Every read is one the least-privilege ACL in
// config.yaml allows (ZRANGE BYSCORE REV, not ZREVRANGEBYSCORE). A
// provider's bucket has the provider's name as both subject and rule.

func quotaKey(prefix, recipient, policy string) string {
	return keyspace.Quota(keyspace.Tag(prefix, recipient), policy)
}

func bucketKey(prefix, provider string) string {
	return keyspace.Bucket(keyspace.Tag(prefix, provider), provider)
}

func sentKey(prefix, provider string) string {
	return keyspace.Sent(keyspace.Tag(prefix, provider), provider)
}

func bookKey(prefix, provider string) string {
	return keyspace.Book(keyspace.Tag(prefix, provider), provider)
}

func slotsKey(prefix, provider string) string {
	return keyspace.Slots(keyspace.Tag(prefix, provider), provider)
}

// us converts a score or field in µs to an int64; 0 when it is not a number.
func us(s string) int64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return 0
	}
	return int64(f)
}

// readBucket queues the read of a provider's calendar from now (µs); the
// function it returns gives the tokens the bucket could hand out now:
// burst less the slots busy in the next burst/rate.
func readBucket(p redis.Pipeliner, ctx context.Context, prefix, provider string, now int64, rate float64, burst int) func() float64 {
	lo := "(" + strconv.FormatInt(now, 10)
	spans := p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: slotsKey(prefix, provider), Start: lo, Stop: "+inf", ByScore: true, Count: 256})
	return func() float64 {
		to := float64(now) + float64(burst)*1e6/rate
		busy := 0.0
		for _, z := range spans.Val() {
			m, _ := z.Member.(string)
			busy += max(0, min(z.Score, to)-max(float64(us(m)), float64(now)))
		}
		return max(0, float64(burst)-busy*rate/1e6)
	}
}

// readPause queues the read of a provider's pause (a 429); the function it
// returns gives the µs it lasts until, or 0 when it has ended.
func readPause(p redis.Pipeliner, ctx context.Context, prefix, provider string) func(now int64) int64 {
	s := p.HGet(ctx, bucketKey(prefix, provider), keyspace.PauseField)
	return func(now int64) int64 {
		if at := us(s.Val()); at > now {
			return at
		}
		return 0
	}
}

// readSends queues counts of the provider's sends in n bins of width µs
// ending at now, oldest first, from the workers' 10 s bins (a bin counts in
// the output bin its start falls in).
func readSends(p redis.Pipeliner, ctx context.Context, prefix, provider string, now, width int64, n int) func() []int64 {
	all := p.HGetAll(ctx, sentKey(prefix, provider))
	return func() []int64 {
		out := make([]int64, n)
		for f, v := range all.Val() {
			at := us(f) * keyspace.SentBin
			if i := n - 1 - int((now-at)/width); at <= now && i >= 0 && i < n {
				out[i] += us(v)
			}
		}
		return out
	}
}

// bookingSet holds the moments a subject's keys hold for tasks ahead of now.
type bookingSet struct {
	Ahead int64    // how far ahead of now the latest is, µs
	Held  int64    // how many
	Tasks []taskAt // the first ones, soonest first, at most the limit asked
}

type taskAt struct {
	Task string
	At   int64 // µs
}

// readProviderBookings queues the reads of what a provider holds for tasks:
// its tickets (booked slots, kept keyspace.Grace after them) and its
// ledger's slots of tasks that go after now. A slot of start V lets its
// task go up to slack (µs: the burst less one, over the rate) before V, so
// moments are shown as V - slack.
func readProviderBookings(p redis.Pipeliner, ctx context.Context, prefix, provider string, now, slack int64, limit int) func() bookingSet {
	tickets := readBookings(p, ctx, bookKey(prefix, provider), now-keyspace.Grace, now, limit)
	reserved := readLedger(p, ctx, slotsKey(prefix, provider), now+slack, now, limit)
	return func() bookingSet {
		b := merge(tickets(), reserved(), limit)
		for i := range b.Tasks {
			b.Tasks[i].At -= slack
		}
		b.Ahead = max(0, b.Ahead-slack)
		return b
	}
}

// readRecipientBookings queues the reads of the bookings held for a
// recipient under one policy: its quota entries ahead of now.
func readRecipientBookings(p redis.Pipeliner, ctx context.Context, prefix, recipient, policy string, now int64, limit int) func() bookingSet {
	return readBookings(p, ctx, quotaKey(prefix, recipient, policy), now, now, limit)
}

// readBookings queues the reads of the moments held for tasks in the sorted
// set at key after from (µs); the function it returns gives them once the
// pipeline ran.
func readBookings(p redis.Pipeliner, ctx context.Context, key string, from, now int64, limit int) func() bookingSet {
	lo := "(" + strconv.FormatInt(from, 10)
	count := p.ZCount(ctx, key, lo, "+inf")
	first := p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: lo, Stop: "+inf", ByScore: true, Count: int64(limit + 1)})
	last := p.ZRevRangeWithScores(ctx, key, 0, 0)
	return func() bookingSet {
		b := bookingSet{Held: count.Val()}
		for _, z := range last.Val() {
			if int64(z.Score) > now {
				b.Ahead = max(b.Ahead, int64(z.Score)-now)
			}
		}
		for _, z := range first.Val() {
			if m, _ := z.Member.(string); len(b.Tasks) < limit {
				b.Tasks = append(b.Tasks, taskAt{Task: keyspace.TaskOf(m), At: int64(z.Score)})
			}
		}
		return b
	}
}

// readLedger is readBookings of a bucket's ledger, whose entries live in
// its calendar (key), each scored minus its slot's start.
func readLedger(p redis.Pipeliner, ctx context.Context, key string, from, now int64, limit int) func() bookingSet {
	hi := "(" + strconv.FormatInt(-from, 10)
	count := p.ZCount(ctx, key, "-inf", hi)
	first := p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: hi, Stop: "-inf", ByScore: true, Rev: true, Count: int64(limit + 1)})
	last := p.ZRangeWithScores(ctx, key, 0, 0)
	return func() bookingSet {
		b := bookingSet{Held: count.Val()}
		for _, z := range last.Val() {
			if v := -int64(z.Score); v > now {
				b.Ahead = v - now
			}
		}
		for _, z := range first.Val() {
			if m, _ := z.Member.(string); len(b.Tasks) < limit {
				b.Tasks = append(b.Tasks, taskAt{Task: strings.TrimPrefix(m, keyspace.LedgerEntry("")), At: -int64(z.Score)})
			}
		}
		return b
	}
}

// merge adds b's bookings to a's, keeping the first limit by moment.
func merge(a, b bookingSet, limit int) bookingSet {
	out := bookingSet{Held: a.Held + b.Held, Ahead: max(a.Ahead, b.Ahead), Tasks: append(a.Tasks, b.Tasks...)}
	sort.Slice(out.Tasks, func(i, j int) bool { return out.Tasks[i].At < out.Tasks[j].At })
	if len(out.Tasks) > limit {
		out.Tasks = out.Tasks[:limit]
	}
	return out
}

// readEntries queues the reads of a recipient's quota under one policy:
// how many entries each window holds, the entry that decides when each
// full window frees a place (the limit-th newest in it), and a page of the
// entries in the longest window, newest first.
func readEntries(p redis.Pipeliner, ctx context.Context, key string, now int64, windows []window, offset, limit int) func() quotaRead {
	longest := int64(0)
	for _, w := range windows {
		longest = max(longest, w.per)
	}
	n := len(windows)
	counts := make([]*redis.IntCmd, n)
	decide := make([]*redis.ZSliceCmd, n)
	for i, w := range windows {
		from := "(" + strconv.FormatInt(now-w.per, 10)
		counts[i] = p.ZCount(ctx, key, from, "+inf")
		decide[i] = p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: "+inf", Stop: from, ByScore: true, Rev: true,
			Offset: int64(w.limit - 1), Count: 1}) // REV: from the max to the min
	}
	all := p.ZCount(ctx, key, "("+strconv.FormatInt(now-longest, 10), "+inf")
	newest := p.ZRevRangeWithScores(ctx, key, 0, 0)
	ahead := p.ZCount(ctx, key, "("+strconv.FormatInt(now, 10), "+inf")
	page := p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: "+inf", Stop: "(" + strconv.FormatInt(now-longest, 10),
		ByScore: true, Rev: true, Offset: int64(offset), Count: int64(limit)})
	return func() quotaRead {
		q := quotaRead{total: all.Val(), ahead: ahead.Val(), used: make([]int64, n), decider: make([]int64, n)}
		if z := newest.Val(); len(z) == 1 {
			q.newest = int64(z[0].Score)
		}
		for i := range windows {
			q.used[i] = counts[i].Val()
			q.decider[i] = -1
			if z := decide[i].Val(); len(z) == 1 && q.used[i] >= int64(windows[i].limit) {
				q.decider[i] = int64(z[0].Score)
			}
		}
		for _, z := range page.Val() {
			m, _ := z.Member.(string)
			q.entries = append(q.entries, taskAt{Task: keyspace.TaskOf(m), At: int64(z.Score)})
		}
		return q
	}
}

// window is a quota window in µs.
type window struct {
	limit int
	per   int64
}

// quotaRead is what readEntries found.
type quotaRead struct {
	total   int64    // entries counting in the longest window
	newest  int64    // the newest entry's µs, 0 when none: a booking goes no earlier
	ahead   int64    // entries booked ahead of now, which count in every window
	used    []int64  // entries in each window, those ahead of now included
	decider []int64  // per window: the µs of the entry whose leaving frees a place, -1 when not full
	entries []taskAt // the page asked for, newest first
}
