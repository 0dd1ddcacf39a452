package campaign

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Latest returns, for each campaign in config order, what the fan-out of
// its last tick fired did (Progress): a zero Tick for a campaign never
// fired, or whose last recorded tick never fanned out (the moment it was
// first scheduled, a tick skipped) or is forgotten. Two round trips.
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
