package campaign

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Latest returns, for each campaign in config order, what the fan-out of
// its last fired tick did (see Progress). The record of the last tick also
// holds the moment a campaign was first scheduled and ticks skipped as too
// old to catch up: a tick whose fan-out task and progress are both gone
// (or never were) reports a zero Tick, as does a campaign never fired. It
// costs two round trips and 1 + 3 commands per campaign, whatever the
// audiences' size.
func (r *Runner) Latest(ctx context.Context) ([]Summary, error) {
	scores := make([]*redis.FloatCmd, len(r.names))
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range r.names {
			scores[i] = p.ZScore(ctx, firedKey(r.prefix), name)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("campaign: latest ticks: %w", err)
	}
	out := make([]Summary, len(r.names))
	fields := []string{"read", "enqueued", "existing", "invalid", "done", "expired"}
	progress := make([]*redis.SliceCmd, len(r.names))
	holders := make([]*redis.StringCmd, len(r.names))
	tasks := make([]*redis.IntCmd, len(r.names))
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range r.names {
			if scores[i].Err() != nil {
				continue // never fired
			}
			out[i].Tick = Tick{Campaign: name, Unix: int64(scores[i].Val())}
			k := keysOf(r.prefix, r.campaigns[name].Queue, out[i].Tick)
			progress[i] = p.HMGet(ctx, k.progress, fields...)
			holders[i] = p.Get(ctx, k.lease)
			tasks[i] = p.Exists(ctx, k.taskPfx+out[i].Tick.TaskID())
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("campaign: latest progress: %w", err)
	}
	for i := range out {
		if progress[i] == nil {
			continue
		}
		v := progress[i].Val()
		if tasks[i].Val() == 0 && v[0] == nil {
			out[i] = Summary{} // not a tick that fanned out
			continue
		}
		s := func(j int) string { x, _ := v[j].(string); return x }
		n := func(j int) int64 { x, _ := strconv.ParseInt(s(j), 10, 64); return x }
		out[i].Read, out[i].Enqueued, out[i].Existing, out[i].Invalid = n(0), n(1), n(2), n(3)
		out[i].Done, out[i].Expired = s(4) == "1", s(5) == "1"
		out[i].Holder = holders[i].Val()
	}
	return out, nil
}
