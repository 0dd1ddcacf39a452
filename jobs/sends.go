package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/throttle"
)

// sendsFlushEvery is how often SendCounts.Run writes the counts: the
// dashboard's chart is of 10 s bins, a second late at most.
const sendsFlushEvery = time.Second

// sendsFlushFinal bounds the flush a stopping worker makes.
const sendsFlushFinal = 5 * time.Second

// SendCounts counts the messages a worker's providers accepted, by provider
// bucket and keyspace.SentBin-wide bin of the moment each was sent, and
// writes them to the bucket's state hash, where the dashboard's sends per
// second read them (internal/keyspace, Bucket): at most once a second, one
// pipeline for every bucket with sends since the last write, and once more
// when the worker stops. The admission's script no longer counts its takes
// there: a send is counted when it happens, by the worker that sent it.
//
// A send's bin is that of Redis's clock (now, lifecycle.Recorder.Now: this
// process's clock corrected by its offset from Redis TIME), as the
// admissions' moments are; this process's clock would do for a chart, never
// for a decision, and none is made from these counts. A SendCounts is safe
// for concurrent use; a nil one counts nothing.
type SendCounts struct {
	rdb    redis.UniversalClient
	prefix string
	now    func(context.Context) time.Time
	// Log, if set, logs a write that failed (its counts are kept for the
	// next one).
	Log *slog.Logger

	mu     sync.Mutex
	counts map[string]map[int64]int64 // bucket's state hash -> bin -> sends
}

// NewSendCounts returns the counts of sends through the buckets of keys
// under prefix on rdb, binned by the clock now (nil: this process's).
func NewSendCounts(rdb redis.UniversalClient, prefix string, now func(context.Context) time.Time) *SendCounts {
	if now == nil {
		now = func(context.Context) time.Time { return time.Now() }
	}
	return &SendCounts{rdb: rdb, prefix: prefix, now: now, counts: map[string]map[int64]int64{}}
}

// Add counts n tokens sent now through bucket b of subject (the provider).
func (s *SendCounts) Add(ctx context.Context, b *throttle.Bucket, subject string, n int64) {
	if s == nil || b == nil || n <= 0 {
		return
	}
	s.add(keyspace.Bucket(keyspace.Tag(s.prefix, subject), b.Name()), keyspace.SentBinOf(s.now(ctx)), n)
}

func (s *SendCounts) add(key string, bin, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bins := s.counts[key]
	if bins == nil {
		bins = map[int64]int64{}
		s.counts[key] = bins
	}
	bins[bin] += n
}

// sendsScript adds a bucket's counts to its state hash (KEYS[1]) as
// bucket_sent in lua/rules.lua did: ARGV holds the ms the hash must live at
// least (its life is never shortened: it holds a pause's end too), the
// number of old bins to drop and those bins, then bin and count pairs. A
// script, not a pipeline of its commands, for the life: PEXPIRE GT (Redis
// 7) would not set a first one.
var sendsScript = redis.NewScript(`
local key, ms, nold = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3 + nold, #ARGV, 2 do redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1]) end
redis.call('HDEL', key, unpack(ARGV, 3, 2 + nold))
if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ARGV[1]) end
return 0
`)

// sentDrop is how many bins older than the kept ones a write drops: a gap
// longer than that is one the hash does not outlive (it lives
// keyspace.SentBins and 6 bins after its newest).
const sentDrop = 10

// Flush writes the counts taken since the last write, in one pipeline. On
// an error the counts of the bins still shown are kept for the next.
func (s *SendCounts) Flush(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	counts := s.counts
	if len(counts) == 0 {
		s.mu.Unlock()
		return nil
	}
	s.counts = map[string]map[int64]int64{}
	s.mu.Unlock()
	now := s.now(ctx).UnixMicro()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for key, bins := range counts {
			newest := int64(0)
			for bin := range bins {
				newest = max(newest, bin)
			}
			life := ((newest+keyspace.SentBins+6)*keyspace.SentBin - now + 999) / 1000
			args := make([]any, 0, 2+sentDrop+2*len(bins))
			args = append(args, max(life, 1), sentDrop)
			for i := range int64(sentDrop) {
				args = append(args, strconv.FormatInt(newest-keyspace.SentBins-i, 10))
			}
			for bin, n := range bins {
				args = append(args, strconv.FormatInt(bin, 10), n)
			}
			sendsScript.Eval(ctx, p, []string{key}, args...)
		}
		return nil
	})
	if err == nil {
		return nil
	}
	oldest := keyspace.SentBinOf(time.UnixMicro(now)) - keyspace.SentBins
	for key, bins := range counts {
		for bin, n := range bins {
			if bin > oldest {
				s.add(key, bin, n)
			}
		}
	}
	return fmt.Errorf("jobs: sends per bucket: %w", err)
}

// Run writes the counts every second until ctx ends, then once more (a
// stopping worker's last sends): call it once the handlers have stopped
// sending, or cancel its context then.
func (s *SendCounts) Run(ctx context.Context) {
	if s == nil {
		return
	}
	tick := time.NewTicker(sendsFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sendsFlushFinal)
			defer cancel()
			s.logged(s.Flush(ctx))
			return
		case <-tick.C:
			s.logged(s.Flush(ctx))
		}
	}
}

func (s *SendCounts) logged(err error) {
	if err != nil && s.Log != nil {
		s.Log.Warn("writing the sends per bucket failed: kept for the next write", "err", err)
	}
}
