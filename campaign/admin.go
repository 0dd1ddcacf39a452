package campaign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/config"
)

// ErrUnknown is wrapped by the error about a campaign the config lacks.
var ErrUnknown = errors.New("no such campaign")

// ErrAlreadyFired is returned by Trigger when the tick's fan-out task
// exists already: that second's tick was fired (scheduled or triggered).
var ErrAlreadyFired = errors.New("campaign: tick already fired")

// Entry is a campaign and its next ticks, as List returns it.
type Entry struct {
	Name     string
	Cron     string
	Timezone string // "" for UTC
	Audience string // "file <path>" or "redis set <key>"
	Queue    string
	Next     []time.Time // the next ticks after List's from, in the campaign's zone
}

// List returns cfg's campaigns in config order, each with its next n ticks
// after from.
func List(cfg *config.Config, from time.Time, n int) ([]Entry, error) {
	cs, names, err := campaignsOf(cfg)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(names))
	for _, name := range names {
		c := cs[name]
		loc, _ := c.Location() // checked by Schedule
		e := Entry{Name: name, Cron: c.Cron, Timezone: c.Timezone, Audience: c.Audience.String(), Queue: c.Queue}
		for t := from; len(e.Next) < n; {
			if t = c.schedule.Next(t); t.IsZero() {
				break
			}
			e.Next = append(e.Next, t.In(loc))
		}
		out = append(out, e)
	}
	return out, nil
}

// Trigger fires the campaign named name now, as its schedule would: it
// enqueues the fan-out of the tick at now (to the second) and returns the
// tick. A tick fired already that second is ErrAlreadyFired, with the tick.
func Trigger(ctx context.Context, client *asynq.Client, cfg *config.Config, name string, now time.Time) (Tick, error) {
	cs, _, err := campaignsOf(cfg)
	if err != nil {
		return Tick{}, err
	}
	c := cs[name]
	if c == nil {
		return Tick{}, fmt.Errorf("campaign: %w: %q", ErrUnknown, name)
	}
	tick := NewTick(name, now)
	first, err := enqueueTick(ctx, client, c, tick)
	switch {
	case err != nil:
		return tick, fmt.Errorf("campaign: trigger %s: %w", tick, err)
	case !first:
		return tick, ErrAlreadyFired
	}
	return tick, nil
}
