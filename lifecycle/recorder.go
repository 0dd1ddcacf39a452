package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Recorder records events in their messages' histories and, for a tenant
// with a callback, in the tenant's stream, whence a Dispatcher POSTs them:
// docs/operations.md#events-and-status-callbacks ("The history"). It waits
// on Redis alone, never on an endpoint. A nil *Recorder records nothing and
// has no history. Safe for concurrent use.
type Recorder struct {
	rdb   redis.UniversalClient
	o     Options
	clock clock
}

// NewRecorder returns the recorder of events on rdb.
func NewRecorder(rdb redis.UniversalClient, o Options) *Recorder {
	o = o.withDefaults()
	return &Recorder{rdb: rdb, o: o, clock: clock{rdb: rdb}}
}

// Record writes events in one round trip, each given its ID and its time
// (Now) unless it has them. It returns when Redis has them, or with ctx's
// error: the caller bounds the wait.
func (r *Recorder) Record(ctx context.Context, events ...Event) error {
	if r == nil || len(events) == 0 {
		return nil
	}
	now := r.Now(ctx)
	bodies := make([][]byte, len(events))
	for i := range events {
		events[i].fill(now)
		body, err := json.Marshal(&events[i])
		if err != nil {
			return fmt.Errorf("lifecycle: event %s: %w", events[i].ID, err)
		}
		bodies[i] = body
	}
	err := r.write(ctx, events, bodies, now)
	m := r.o.Metrics
	if err != nil {
		m.Unrecorded.Add(float64(len(events)))
		return fmt.Errorf("lifecycle: %d events not recorded: %w", len(events), err)
	}
	for i := range events {
		m.Recorded.WithLabelValues(string(events[i].Type)).Inc()
	}
	return nil
}

// write pushes each event on its history (the accepted event at the head,
// so that it comes first however late it is recorded) and its tenant's
// stream, trimmed past GiveUp; then, in a second round trip if any, gives
// the histories it made their life and trims those over the limit.
func (r *Recorder) write(ctx context.Context, events []Event, bodies [][]byte, now time.Time) error {
	minID := strconv.FormatInt(now.Add(-r.o.GiveUp).UnixMilli(), 10)
	pushes := make([]*redis.IntCmd, len(events))
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range events {
			key := historyKey(r.o.Prefix, e.Message)
			if e.Type == Accepted {
				pushes[i] = p.LPush(ctx, key, bodies[i])
			} else {
				pushes[i] = p.RPush(ctx, key, bodies[i])
			}
			if _, ok := r.o.Callbacks[e.Tenant]; ok {
				p.XAdd(ctx, &redis.XAddArgs{Stream: streamKey(r.o.Prefix, e.Tenant), MinID: minID, Approx: true,
					Values: []any{"e", bodies[i]}})
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var made, over []string // the histories this call made, and those over the limit
	for i, push := range pushes {
		key := historyKey(r.o.Prefix, events[i].Message)
		switch n := push.Val(); {
		case n == 1:
			made = append(made, key)
		case n > int64(r.o.HistoryLimit):
			over = append(over, key)
		}
	}
	if len(made)+len(over) == 0 {
		return nil
	}
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, key := range made {
			p.PExpire(ctx, key, r.o.History)
		}
		for _, key := range over {
			// The oldest after the first goes: LSET marks it with "",
			// which no event is, and LREM takes the one mark out.
			p.LSet(ctx, key, 1, "")
			p.LRem(ctx, key, 1, "")
		}
		return nil
	})
	return err
}

// Now returns the time by Redis's clock: this process's, corrected by its
// offset from Redis TIME, measured every clockRefresh. A nil Recorder
// returns this process's clock.
func (r *Recorder) Now(ctx context.Context) time.Time {
	if r == nil {
		return time.Now()
	}
	return r.clock.now(ctx)
}

// History returns message's events in the order its history holds them,
// each ID once (an event recorded again is pushed again), each with the
// message's idempotency key; none if it has no history.
func (r *Recorder) History(ctx context.Context, message string) ([]Event, error) {
	if r == nil {
		return nil, nil
	}
	raw, err := r.rdb.LRange(ctx, historyKey(r.o.Prefix, message), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("lifecycle: history of %s: %w", message, err)
	}
	events := make([]Event, 0, len(raw))
	seen := make(map[string]bool, len(raw))
	for _, s := range raw {
		var e Event
		if json.Unmarshal([]byte(s), &e) != nil || seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		events = append(events, e)
	}
	if len(events) > 0 {
		key := keyOf(raw[0])
		for i := range events {
			if events[i].IdempotencyKey == "" {
				events[i].IdempotencyKey = key
			}
		}
	}
	return events, nil
}

// Tenants returns the tenant of each of messages that has a history, from
// its first event, in one round trip: what a provider's later report needs
// to reach the tenant's callback.
func (r *Recorder) Tenants(ctx context.Context, messages ...string) (map[string]string, error) {
	if r == nil {
		return map[string]string{}, nil
	}
	firsts, err := heads(ctx, r.rdb, r.o.Prefix, messages)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: tenants of %d messages: %w", len(messages), err)
	}
	tenants := make(map[string]string, len(firsts))
	for m, first := range firsts {
		var e Event
		if json.Unmarshal([]byte(first), &e) == nil {
			tenants[m] = e.Tenant
		}
	}
	return tenants, nil
}

// heads returns the first event (JSON) of each of messages' histories that
// has one, in one round trip.
func heads(ctx context.Context, rdb redis.UniversalClient, prefix string, messages []string) (map[string]string, error) {
	firsts := make(map[string]string, len(messages))
	if len(messages) == 0 {
		return firsts, nil
	}
	cmds := make(map[string]*redis.StringCmd, len(messages))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range messages {
			if cmds[m] == nil {
				cmds[m] = p.LIndex(ctx, historyKey(prefix, m), 0)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	for m, c := range cmds {
		if c.Err() == nil {
			firsts[m] = c.Val()
		}
	}
	return firsts, nil
}

// keyOf returns the idempotency key of a history's first event, if it is
// the accepted event.
func keyOf(first string) string {
	var e Event
	if json.Unmarshal([]byte(first), &e) != nil || e.Type != Accepted {
		return ""
	}
	return e.IdempotencyKey
}

// clockRefresh is how long a measured offset from Redis's clock is used.
const clockRefresh = time.Minute

// clock is Redis's clock as this process estimates it.
type clock struct {
	rdb redis.UniversalClient

	mu        sync.Mutex
	offset    time.Duration // this process's clock ahead of Redis's
	measured  time.Time     // when offset was measured; zero: never
	measuring bool          // a call is measuring it: the others use the offset they find
}

// now returns this process's clock less the offset, measured first if it
// is older than clockRefresh and no other call is measuring it. A failed
// measure keeps the offset it had (zero before the first).
func (c *clock) now(ctx context.Context) time.Time {
	c.mu.Lock()
	offset, measure := c.offset, time.Since(c.measured) > clockRefresh && !c.measuring
	c.measuring = c.measuring || measure
	c.mu.Unlock()
	if !measure {
		return time.Now().Add(-offset)
	}
	before := time.Now()
	redisNow, err := c.rdb.Time(ctx).Result()
	after := time.Now()
	c.mu.Lock()
	if err == nil {
		offset = before.Add(after.Sub(before) / 2).Sub(redisNow) // at the middle of the round trip
		c.offset, c.measured = offset, after
	}
	c.measuring = false
	c.mu.Unlock()
	return time.Now().Add(-offset)
}
