package jobs

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/throttle"
)

// A provider's rate changed in the config (a reload, or a start with a new
// file) leaves the work waiting on it on its old pace: its booked slots,
// tenants' lines and places in Redis, and the wake-ups of its tasks in
// asynq. Repace moves both to the new rate: the throttle scales the moments
// it holds around now (throttle.Limiter.Repace), and the wake-ups of the
// provider's waiting tasks are scaled the same way, so a raised rate
// drains what waits at the new pace at once and a lowered one spreads it
// out, each task coming back once. The scan of the retry sets costs one
// read per waiting task, once per change, never per message.

//go:embed repace.lua
var repaceSource string

var repaceScript = redis.NewScript(repaceSource)

// repaceBatch is how many waiting tasks the scan reads per round trip.
const repaceBatch = 500

// Repace moves the waiting work of each provider whose rate changed to its
// new rate (see above), looking for its waiting tasks in queues; rdb is
// asynq's Redis. It returns how many tasks it moved. Every worker may call
// it after a reload: only the first to reach a provider's bucket scales its
// work.
func (t *Throttle) Repace(ctx context.Context, rdb redis.UniversalClient, queues []string) (int, error) {
	rs := t.rules()
	moved := 0
	for _, name := range slices.Sorted(maps.Keys(rs.Providers)) {
		route := rs.Providers[name]
		if route.Shadow || route.Bucket == nil {
			continue
		}
		k, now, err := t.Limiter.Repace(ctx, route.Bucket, name)
		if err != nil {
			return moved, err
		}
		if k == 0 {
			continue
		}
		n, err := repaceQueued(ctx, rdb, t.Waker, queues, name, now, k)
		moved += n
		t.Log.Info("provider rate changed: waiting work re-paced", "provider", name, "rate", route.Bucket.String(),
			"factor", strconv.FormatFloat(k, 'g', 4, 64), "waiting_tasks_moved", n)
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// queued is a task waiting in a queue's retry set: a notification or
// digest of a provider, for a tenant ("" none), and its wake-up, if a
// Waker wakes it (Unix ms; 0 none), with the wake set that holds it.
type queued struct {
	q, id            string
	score            float64
	wake             float64
	wakeKey          string
	provider, tenant string
}

// waiting calls each with the batches of the tasks waiting in queues'
// retry sets, read repaceBatch at a time: one read of each task's message
// (and, with a Waker, of its wake-up).
func waiting(ctx context.Context, rdb redis.UniversalClient, w *Waker, queues []string, each func([]queued) (int, error)) (int, error) {
	moved := 0
	for _, q := range queues {
		var notes map[string]noted
		if w != nil {
			var err error
			if notes, err = w.notesOf(ctx, q); err != nil {
				return moved, err
			}
		}
		retry := asynqdb.RetryKey(q)
		for start := int64(0); ; start += repaceBatch {
			z, err := rdb.ZRangeWithScores(ctx, retry, start, start+repaceBatch-1).Result()
			if err != nil {
				return moved, fmt.Errorf("jobs: read %s: %w", retry, err)
			}
			ts, err := readQueued(ctx, rdb, notes, q, z)
			if err != nil {
				return moved, err
			}
			n, err := each(ts)
			moved += n
			if err != nil {
				return moved, err
			}
			if len(z) < repaceBatch {
				break
			}
		}
	}
	return moved, nil
}

// readQueued reads the tasks of z (members of queue q's retry set): those
// that are notifications or digests, with their provider and tenant, and
// their wake-ups in notes (if any).
func readQueued(ctx context.Context, rdb redis.UniversalClient, notes map[string]noted, q string, z []redis.Z) ([]queued, error) {
	if len(z) == 0 {
		return nil, nil
	}
	reads := make([]*redis.StringCmd, len(z))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range z {
			reads[i] = p.HGet(ctx, asynqdb.TaskKey(q, e.Member.(string)), "msg")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("jobs: read tasks of %s: %w", q, err)
	}
	var out []queued
	for i, e := range z {
		if provider, tenant, ok := routeOf(reads[i].Val()); ok {
			t := queued{q: q, id: e.Member.(string), score: e.Score, provider: provider, tenant: tenant}
			if n, ok := notes[t.id]; ok {
				t.wake, t.wakeKey = n.wake, n.key
			}
			out = append(out, t)
		}
	}
	return out, nil
}

// repaceQueued scales the wake-ups of provider's tasks waiting in queues'
// retry sets around now by k.
func repaceQueued(ctx context.Context, rdb redis.UniversalClient, w *Waker, queues []string, provider string, now time.Time, k float64) (int, error) {
	return waiting(ctx, rdb, w, queues, func(ts []queued) (int, error) {
		return moveWakeups(ctx, rdb, w, ts, func(t queued) float64 {
			if t.provider != provider {
				return 1
			}
			return k
		}, now)
	})
}

// moveWakeups scales the wake-up of each task of ts around now by the
// factor k gives it, unless the task moved on since it was read: its
// wake-up (if it has one; it moves to w's set, whose looks follow it) and
// the one asynq holds for it.
func moveWakeups(ctx context.Context, rdb redis.UniversalClient, w *Waker, ts []queued, k func(queued) float64, now time.Time) (int, error) {
	if len(ts) == 0 {
		return 0, nil
	}
	if err := repaceScript.Load(ctx, rdb).Err(); err != nil {
		return 0, fmt.Errorf("jobs: move wake-ups: load the script: %w", err)
	}
	// A move, and the Waker's wake-up it moved the task's to (0: none).
	type move struct {
		c    *redis.Cmd
		q    string
		wake int64
	}
	var moves []move
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, t := range ts {
			f := k(t)
			if f == 1 {
				continue
			}
			if t.wake > 0 && w != nil {
				wake, score := w.scaled(t.wake, now, f)
				keys := []string{asynqdb.RetryKey(t.q), t.wakeKey, w.notesKey(t.q)}
				moves = append(moves, move{repaceScript.EvalSha(ctx, p, keys, t.id, int64(t.score), score, int64(t.wake), wake), t.q, wake})
			} else if score, ok := wakeScaled(t.score, now, f); ok {
				moves = append(moves, move{c: repaceScript.EvalSha(ctx, p, []string{asynqdb.RetryKey(t.q)}, t.id, int64(t.score), score)})
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("jobs: move wake-ups: %w", err)
	}
	n := 0
	for _, m := range moves {
		if m.c.Val() != int64(1) {
			continue
		}
		n++
		if m.wake > 0 {
			w.expect(m.q, m.wake)
		}
	}
	return n, nil
}

// wakeScaled is the retry score (a Unix second) of a task due at score,
// its moment scaled around now by k, and whether it changed, for a task no
// Waker wakes. A booked task asks to wake wakeEarly before its moment and asynq keeps the second the
// wake-up falls in: the moment is taken as wakeEarly and half a second
// after the score, and the score moves as that moment does (a task not
// booked, a send's backoff, moves the same way: it is admitted again
// whenever it wakes).
func wakeScaled(score float64, now time.Time, k float64) (int64, bool) {
	at := time.Unix(int64(score), 0).Add(wakeEarly + time.Second/2)
	to := throttle.Scale(at, now, k)
	moved := int64(math.Round(score + to.Sub(at).Seconds()))
	return moved, moved != int64(score)
}

// routeOf returns the provider and tenant of msg (a task hash's msg), if it
// is a notification or digest.
func routeOf(msg string) (provider, tenant string, ok bool) {
	if msg == "" {
		return "", "", false
	}
	typ, payload, err := asynqdb.Payload([]byte(msg))
	if err != nil || typ != TypeNotify && typ != TypeDigest {
		return "", "", false
	}
	var p struct {
		Provider string `json:"provider"`
		Tenant   string `json:"tenant"`
	}
	if json.Unmarshal(payload, &p) != nil {
		return "", "", false
	}
	return p.Provider, p.Tenant, true
}

// A tenant's weight changed in the config (a reload) leaves the lines
// waiting on a provider on the old shares until the places handed out are
// used up. Reweigh moves them: the throttle scales each waiting tenant's
// line, and the places of its tasks in line, by the factor its stride
// changes by (throttle.Limiter.Reweigh), and the wake-ups of those tasks
// are scaled the same way, so the new shares apply to the work already
// waiting, each task coming back once. Like Repace it reads each waiting
// task once per change, never per message.

// Reweigh moves the tenants' lines waiting on each provider to the
// tenants' weights in effect (see above), looking for the waiting tasks in
// queues; rdb is asynq's Redis. It returns how many tasks it moved. Every
// worker may call it at start and after a reload: only the first to reach
// a provider's bucket finds weights to change, and the queues are read only
// when one of the buckets it asks first (Limiter.Reweighed) has.
func (t *Throttle) Reweigh(ctx context.Context, rdb redis.UniversalClient, queues []string) (int, error) {
	rs := t.rules()
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(rs.Providers)) {
		route := rs.Providers[name]
		if route.Shadow || route.Bucket == nil {
			continue
		}
		yes, err := t.Limiter.Reweighed(ctx, route.Bucket, name, rs.Weights)
		if err != nil {
			return 0, err
		}
		if yes {
			changed = append(changed, name)
		}
	}
	if len(changed) == 0 {
		return 0, nil
	}
	var ts []queued
	if _, err := waiting(ctx, rdb, t.Waker, queues, func(batch []queued) (int, error) {
		ts = append(ts, batch...)
		return 0, nil
	}); err != nil {
		return 0, err
	}
	moved := 0
	for _, name := range changed {
		n, err := t.reweigh(ctx, rdb, rs, name, ts)
		moved += n
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// reweigh moves the lines waiting on provider name (see Reweigh), ts the
// tasks waiting in the queues.
func (t *Throttle) reweigh(ctx context.Context, rdb redis.UniversalClient, rs *Rules, name string, ts []queued) (int, error) {
	// Every tenant waiting is named (one not weighed weighs 1), so that
	// each one's factor comes back for its tasks' wake-ups.
	weights := maps.Clone(rs.Weights)
	if weights == nil {
		weights = map[string]int{}
	}
	for _, w := range ts {
		if _, ok := weights[w.tenant]; !ok && w.provider == name {
			weights[w.tenant] = 1
		}
	}
	k, now, err := t.Limiter.Reweigh(ctx, rs.Providers[name].Bucket, name, weights)
	if err != nil || k == nil {
		return 0, err
	}
	n, err := moveWakeups(ctx, rdb, t.Waker, ts, func(w queued) float64 {
		if w.provider != name {
			return 1
		}
		return k[w.tenant]
	}, now)
	t.Log.Info("tenants' weights changed: waiting lines re-paced", "provider", name, "waiting_tasks_moved", n)
	return n, err
}
