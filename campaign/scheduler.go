package campaign

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
)

// late is how far behind its tick a scheduler may wake (a paused process, a
// busy machine) and still fire it as live; later, it catches up instead.
const late = 5 * time.Second

// maxCounted bounds the missed ticks counted for a log line.
const maxCounted = 10000

// schedule fires c's ticks until ctx ends; every worker does, and the
// tick's task ID makes one fan-out of the fleet's fires. A timer per
// Schedule.Next rather than cron.Cron, which neither tells a job its tick
// nor catches up.
func (r *Runner) schedule(ctx context.Context, c *campaign) {
	last := time.Now()
	r.catchUp(ctx, c, last)
	for {
		next := c.schedule.Next(last)
		if next.IsZero() {
			r.log.Warn("campaign schedule has no next tick", "campaign", c.Name, "cron", c.Cron)
			return
		}
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		if now := time.Now(); now.Sub(next) > late {
			r.log.Warn("campaign scheduler woke late: catching up", "campaign", c.Name, "tick", next, "late", now.Sub(next).Round(time.Millisecond))
			r.catchUp(ctx, c, now)
			last = now
			continue
		}
		r.fire(ctx, c, NewTick(c.Name, next))
		last = next
	}
}

// fire enqueues tick's fan-out task, retrying while the tick is within its
// campaign's catch-up (or a minute), and records the tick as fired.
func (r *Runner) fire(ctx context.Context, c *campaign, tick Tick) bool {
	deadline := tick.Time().Add(max(c.CatchUp, time.Minute))
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		first, err := enqueueTick(ctx, r.client, c, tick)
		if err == nil {
			if first {
				r.log.Info("campaign tick fired", "campaign", c.Name, "tick", tick.Time(), "task", tick.TaskID())
			}
			// Recorded even if the Runner stops now: the tick has fired.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			err := r.rdb.ZAddGT(rctx, firedKey(r.prefix), redis.Z{Score: float64(tick.Unix), Member: c.Name}).Err()
			cancel()
			if err != nil {
				r.log.Warn("campaign: recording the last tick failed", "campaign", c.Name, "err", err)
			}
			return true
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			r.log.Error("campaign tick not fired", "campaign", c.Name, "tick", tick.Time(), "err", err)
			return false
		}
		r.log.Warn("campaign tick: enqueue failed, retrying", "campaign", c.Name, "tick", tick.Time(), "in", wait, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// enqueueTick enqueues tick's fan-out task and reports whether this call
// did: false when another worker fired the tick already.
func enqueueTick(ctx context.Context, client *asynq.Client, c *campaign, tick Tick) (bool, error) {
	task := asynq.NewTask(TypeFanout, tick.payload(),
		asynq.TaskID(tick.TaskID()), asynq.Queue(c.Queue), asynq.Retention(c.keep()),
		asynq.MaxRetry(fanoutRetries), asynq.Timeout(c.keep()))
	_, err := client.EnqueueContext(ctx, task)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, nil
	}
	return err == nil, err
}

// catchUp fires c's latest tick missed up to now if it is within
// c.CatchUp, and logs those it skips. With no record of a last tick fired,
// c is new and nothing was missed.
func (r *Runner) catchUp(ctx context.Context, c *campaign, now time.Time) {
	key := firedKey(r.prefix)
	score, err := r.rdb.ZScore(ctx, key, c.Name).Result()
	if errors.Is(err, redis.Nil) {
		// Another worker starting now may write it first: as good.
		err = r.rdb.ZAddNX(ctx, key, redis.Z{Score: float64(now.Unix()), Member: c.Name}).Err()
		if err == nil {
			r.log.Info("campaign scheduled for the first time", "campaign", c.Name, "next", c.schedule.Next(now))
			return
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("campaign: cannot read the last tick fired: no catching up", "campaign", c.Name, "err", err)
		}
		return
	}
	since := time.Unix(int64(score), 0)
	latest := latestTick(c.schedule, since, now)
	if latest.IsZero() {
		return
	}
	missed := countTicks(c.schedule, since, latest)
	if now.Sub(latest) > c.CatchUp {
		r.log.Warn("campaign ticks missed while no worker ran: skipped, older than catch_up", "campaign", c.Name,
			"missed", missed, "first", c.schedule.Next(since), "latest", latest, "catch_up", c.CatchUp)
		if err := r.rdb.ZAddGT(ctx, key, redis.Z{Score: float64(latest.Unix()), Member: c.Name}).Err(); err != nil {
			r.log.Warn("campaign: recording the last tick failed", "campaign", c.Name, "err", err)
		}
		return
	}
	if missed > 1 {
		r.log.Warn("campaign ticks missed while no worker ran: skipped all but the latest", "campaign", c.Name,
			"skipped", missed-1, "first", c.schedule.Next(since), "latest", latest)
	}
	r.log.Info("campaign catching up a missed tick", "campaign", c.Name, "tick", latest, "late", now.Sub(latest).Round(time.Second))
	r.fire(ctx, c, NewTick(c.Name, latest))
}

// latestTick returns the last tick of s in (since, now], or the zero time,
// looking back over windows that double: a long outage costs a few Next
// calls, not one per tick missed.
func latestTick(s cron.Schedule, since, now time.Time) time.Time {
	for back := time.Second; ; back *= 2 {
		from := now.Add(-back)
		if !from.After(since) {
			from = since
		}
		var last time.Time
		for t := s.Next(from); !t.IsZero() && !t.After(now); t = s.Next(t) {
			last = t
		}
		if !last.IsZero() || from.Equal(since) {
			return last
		}
	}
}

// countTicks counts s's ticks in (since, until], up to maxCounted.
func countTicks(s cron.Schedule, since, until time.Time) int {
	n := 0
	for t := s.Next(since); !t.IsZero() && !t.After(until) && n < maxCounted; t = s.Next(t) {
		n++
	}
	return n
}

// watch resumes, every opts.Watch, the fan-outs whose lease expired (their
// worker died or gave up); a claim decides which worker resumes one.
func (r *Runner) watch(ctx context.Context) {
	t := time.NewTicker(r.opts.Watch)
	defer t.Stop()
	for {
		r.resumeAbandoned(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Runner) resumeAbandoned(ctx context.Context) {
	for _, q := range r.queues() {
		members, err := r.rdb.ZRangeByScore(ctx, runningKey(r.prefix, q), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(time.Now().Unix(), 10)}).Result()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("campaign: reading unfinished fan-outs failed", "queue", q, "err", err)
			}
			continue
		}
		for _, m := range members {
			tick, ok := parseMember(m)
			c := r.campaigns[tick.Campaign]
			if !ok || c == nil || c.Queue != q {
				continue // another config's campaign: its workers watch it
			}
			held, err := r.rdb.Exists(ctx, keysOf(r.prefix, q, tick).lease).Result()
			if err != nil || held == 1 {
				continue
			}
			if _, running := r.resumes.LoadOrStore(tick, true); running {
				continue // this process resumes it already
			}
			r.wg.Go(func() {
				defer r.resumes.Delete(tick)
				r.log.Info("campaign fan-out abandoned by its worker: resuming", "campaign", tick.Campaign, "tick", tick.Time())
				if _, err := r.fanOut(ctx, c, tick, "resume"); err != nil && !errors.Is(err, errLeaseLost) && ctx.Err() == nil {
					r.log.Warn("campaign fan-out resume failed; it will be tried again", "campaign", tick.Campaign, "tick", tick.Time(), "err", err)
				}
			})
		}
	}
}
