package campaign

import (
	"context"
	"errors"
	"fmt"

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
	reads := make([]func() (Summary, bool), len(r.names))
	tasks := make([]*redis.IntCmd, len(r.names))
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range r.names {
			if scores[i].Err() != nil {
				continue // never fired
			}
			tick := Tick{Campaign: name, Unix: int64(scores[i].Val())}
			k := keysOf(r.prefix, r.campaigns[name].Queue, tick)
			reads[i] = readProgress(ctx, p, k, tick)
			tasks[i] = p.Exists(ctx, k.taskPfx+tick.TaskID())
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("campaign: latest progress: %w", err)
	}
	for i, read := range reads {
		if read == nil {
			continue
		}
		if s, recorded := read(); recorded || tasks[i].Val() == 1 { // else not a tick that fanned out
			out[i] = s
		}
	}
	return out, nil
}
