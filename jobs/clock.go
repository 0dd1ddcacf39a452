package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// A worker's clock and Redis's. The throttle decides by Redis TIME alone,
// but asynq schedules retry times and leases on the worker's clock: a fast
// worker's deferrals wake late, a slow one's early, and a slow worker's
// leases look expired to the others, which redeliver its tasks mid-send
// (TestWorkerClockSkew). So the worker measures its offset from Redis at
// start-up and every clockCheckInterval, exports it, and warns from
// clockWarnOffset on.

// clockWarnOffset is the clock offset from Redis at which WatchClock warns:
// asynq's retry times are whole seconds, so less than this changes nothing.
const clockWarnOffset = time.Second

// clockCheckInterval is how often WatchClock measures the offset.
const clockCheckInterval = time.Minute

// clockOffset returns how far this process's wall clock is ahead of Redis
// TIME (negative: behind), read at the middle of the round trip; the error
// is at most half the round trip.
func clockOffset(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	before := time.Now()
	redisNow, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	after := time.Now()
	mid := before.Add(after.Sub(before) / 2) // monotonic half round trip
	return mid.Sub(redisNow), nil
}

// WatchClock measures the clock offset now and every clockCheckInterval
// until ctx ends, sets it on m.ClockOffset, and logs a warning when it
// reaches clockWarnOffset (and again when it moves by another
// clockWarnOffset), and a note when it is back within it. A failed
// measurement (Redis unreachable) is skipped: the outage is logged
// elsewhere.
func WatchClock(ctx context.Context, rdb redis.UniversalClient, m *Metrics, log *slog.Logger) {
	w := &clockWatch{rdb: rdb, m: m, log: log}
	w.check(ctx)
	tick := time.NewTicker(clockCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			w.check(ctx)
		}
	}
}

// clockWatch is WatchClock's state between measurements.
type clockWatch struct {
	rdb    redis.UniversalClient
	m      *Metrics
	log    *slog.Logger
	warned *time.Duration // the offset last warned about; nil: none
}

// check measures the offset once, sets the gauge and logs what WatchClock
// says it logs; it returns the offset and whether it measured one.
func (w *clockWatch) check(ctx context.Context) (time.Duration, bool) {
	off, err := clockOffset(ctx, w.rdb)
	if err != nil {
		return 0, false
	}
	w.m.ClockOffset.Set(off.Seconds())
	switch {
	case off.Abs() >= clockWarnOffset && (w.warned == nil || (off-*w.warned).Abs() >= clockWarnOffset):
		w.warned = &off
		w.log.Warn("this worker's clock is off Redis's: throttle decisions are not affected (they use Redis TIME), "+
			"but asynq schedules on this clock: deferred jobs wake early or late by the offset, and a slow clock "+
			"makes other workers take this one's running tasks for lost; synchronize the clock (NTP)",
			"ahead_of_redis", off.Round(time.Millisecond))
	case off.Abs() < clockWarnOffset && w.warned != nil:
		w.warned = nil
		w.log.Info("this worker's clock is back within a second of Redis's", "ahead_of_redis", off.Round(time.Millisecond))
	}
	return off, true
}
