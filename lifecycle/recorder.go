package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Recorder records events: each in its message's history and, for a tenant
// with a callback, in the tenant's stream, whence a Dispatcher POSTs it.
// Recording costs one round trip of one command an event (the history's
// RPUSH; the stream's XADD beside it), several events in one, and waits on
// Redis alone: an endpoint that is down or slow costs it nothing. A nil
// *Recorder records nothing and has no history. Safe for concurrent use.
//
// A history is a list: the accepted event is pushed at its head, the
// others at its tail, so that the accepted event comes first whenever it
// is recorded (the API records it just after the enqueue, by which time a
// worker may have recorded the message's first outcome). The push that
// makes the list (the accepted event's, as a rule) gives it its life,
// Options.History; the rare push that takes it over Options.HistoryLimit
// drops the oldest after the first, in a second round trip. An event
// recorded again (a worker killed and its task run again) is pushed
// again: History reads each ID once.
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

// Record writes events, in one round trip: each is given its ID and its
// time (now by Redis's clock, see Now) unless it has them. It returns when
// Redis has them, or with ctx's error: the caller bounds how long it
// waits. The error says how many were not written.
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

// write pushes each event on its history and, for a tenant with a
// callback, adds it to the tenant's stream, trimmed of the events older
// than GiveUp, in one pipeline; then gives the histories it made their
// life and trims those over the limit, in another if any.
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
	var after []string // keys to expire ("+" first) and to trim
	for i, push := range pushes {
		key := historyKey(r.o.Prefix, events[i].Message)
		switch n := push.Val(); {
		case n == 1:
			after = append(after, "+"+key)
		case n > int64(r.o.HistoryLimit):
			after = append(after, key)
		}
	}
	if len(after) == 0 {
		return nil
	}
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, key := range after {
			if made, ok := strings.CutPrefix(key, "+"); ok {
				p.PExpire(ctx, made, r.o.History)
				continue
			}
			// The oldest after the first goes: LSET marks it with "",
			// which no event is, and LREM takes the one mark out.
			p.LSet(ctx, key, 1, "")
			p.LRem(ctx, key, 1, "")
		}
		return nil
	})
	return err
}

// Now returns the time by Redis's clock: this process's clock corrected by
// its offset from Redis TIME, measured on first use and again after a
// minute (within half a round trip, plus what the clocks drift apart in a
// minute). A nil Recorder returns this process's clock.
func (r *Recorder) Now(ctx context.Context) time.Time {
	if r == nil {
		return time.Now()
	}
	return r.clock.now(ctx)
}

// History returns message's events, in the order its history holds them
// (its accepted event first, the others as they were recorded), each once
// and with the message's idempotency key; none if it has no history, or
// it expired.
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

// Tenants returns the tenant of each of messages that has a history, read
// from its first event in one round trip: what a provider's later report
// of a message (package feedback) needs to reach the tenant's callback. A
// message without a history (never recorded, or expired) is not in the
// map.
func (r *Recorder) Tenants(ctx context.Context, messages ...string) (map[string]string, error) {
	if r == nil || len(messages) == 0 {
		return map[string]string{}, nil
	}
	firsts := make(map[string]*redis.StringCmd, len(messages))
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range messages {
			if firsts[m] == nil {
				firsts[m] = p.LIndex(ctx, historyKey(r.o.Prefix, m), 0)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("lifecycle: tenants of %d messages: %w", len(firsts), err)
	}
	tenants := make(map[string]string, len(firsts))
	for m, c := range firsts {
		var e struct {
			Tenant string `json:"tenant"`
		}
		if c.Err() == nil && json.Unmarshal([]byte(c.Val()), &e) == nil {
			tenants[m] = e.Tenant
		}
	}
	return tenants, nil
}

// keyOf returns the idempotency key of the first event of a history, if it
// is the accepted event and has one.
func keyOf(first string) string {
	var e struct {
		Type Type   `json:"type"`
		Key  string `json:"idempotency_key"`
	}
	if json.Unmarshal([]byte(first), &e) != nil || e.Type != Accepted {
		return ""
	}
	return e.Key
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
