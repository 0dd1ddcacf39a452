package throttle

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// sends counts the tokens of the sends a worker made, per bucket state key,
// until CountSends writes them.
type sends struct {
	mu sync.Mutex
	n  map[string]int64
}

// Sent counts a send of cost tokens of bucket rule for subject (a provider)
// for the dashboard's chart of sends (keyspace.Sent). The count reaches
// Redis with CountSends's next write: once a second per bucket and worker,
// rather than a command in every admission.
func (l *Limiter) Sent(rule Rule, subject string, cost int) {
	l.sent.add(map[string]int64{keyspace.Sent(keyspace.Tag(l.prefix, subject), rule.Name()): int64(max(cost, 1))})
}

// add adds counts n to s's.
func (s *sends) add(n map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int64{}
	}
	for key, c := range n {
		s.n[key] += c
	}
}

// take returns the counts and starts from none.
func (s *sends) take() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n
	s.n = nil
	return n
}

// CountSends writes the counts of Sent every second until ctx ends, then
// once more.
func (l *Limiter) CountSends(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.writeSends(ctx)
		case <-ctx.Done():
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			l.writeSends(ctx)
			return
		}
	}
}

// writeSends adds the counts to their hashes, in the bin of Redis's clock;
// the first count of a bin drops the bins SentBins to SentBins + 9 older
// and makes the hash live SentBins bins more. Counts it could not add are
// kept for the next time.
func (l *Limiter) writeSends(ctx context.Context) {
	n := l.sent.take()
	if len(n) == 0 {
		return
	}
	now, err := l.rdb.Time(ctx).Result()
	if err != nil {
		l.sent.add(n)
		return
	}
	bin := now.UnixMicro() / keyspace.SentBin
	field := strconv.FormatInt(bin, 10)
	incr := map[string]*redis.IntCmd{}
	_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for key, c := range n {
			incr[key] = p.HIncrBy(ctx, key, field, c)
		}
		return nil
	})
	old := make([]string, 10)
	for i := range old {
		old[i] = strconv.FormatInt(bin-keyspace.SentBins-int64(i), 10)
	}
	life := time.Duration((bin+keyspace.SentBins+1)*keyspace.SentBin-now.UnixMicro()) * time.Microsecond
	_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for key, cmd := range incr {
			switch {
			case cmd.Err() != nil:
				l.sent.add(map[string]int64{key: n[key]})
			case cmd.Val() == n[key]: // the first count of the bin
				p.HDel(ctx, key, old...)
				p.PExpire(ctx, key, life)
			}
		}
		return nil
	})
}
