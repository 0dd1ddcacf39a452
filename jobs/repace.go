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
		n, err := repaceQueued(ctx, rdb, queues, name, now, k)
		moved += n
		t.Log.Info("provider rate changed: waiting work re-paced", "provider", name, "rate", route.Bucket.String(),
			"factor", strconv.FormatFloat(k, 'g', 4, 64), "waiting_tasks_moved", n)
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// repaceQueued scales the wake-ups of provider's tasks waiting in queues'
// retry sets around now by k.
func repaceQueued(ctx context.Context, rdb redis.UniversalClient, queues []string, provider string, now time.Time, k float64) (int, error) {
	moved := 0
	for _, q := range queues {
		retry := asynqdb.RetryKey(q)
		for start := int64(0); ; start += repaceBatch {
			z, err := rdb.ZRangeWithScores(ctx, retry, start, start+repaceBatch-1).Result()
			if err != nil {
				return moved, fmt.Errorf("jobs: repace %s: read %s: %w", provider, retry, err)
			}
			n, err := repaceBatchOf(ctx, rdb, q, z, provider, now, k)
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

// repaceBatchOf moves the wake-ups of the tasks of z (members of queue q's
// retry set) that are provider's.
func repaceBatchOf(ctx context.Context, rdb redis.UniversalClient, q string, z []redis.Z, provider string, now time.Time, k float64) (int, error) {
	if len(z) == 0 {
		return 0, nil
	}
	if err := repaceScript.Load(ctx, rdb).Err(); err != nil {
		return 0, fmt.Errorf("jobs: repace %s: load the script: %w", provider, err)
	}
	reads := make([]*redis.StringCmd, len(z))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range z {
			reads[i] = p.HGet(ctx, asynqdb.TaskKey(q, e.Member.(string)), "msg")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return 0, fmt.Errorf("jobs: repace %s: read tasks of %s: %w", provider, q, err)
	}
	var moves []*redis.Cmd
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range z {
			if !providerOf(reads[i].Val(), provider) {
				continue
			}
			if score, ok := wakeScaled(e.Score, now, k); ok {
				moves = append(moves, repaceScript.EvalSha(ctx, p, []string{asynqdb.RetryKey(q)},
					e.Member.(string), int64(e.Score), score))
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("jobs: repace %s: move tasks of %s: %w", provider, q, err)
	}
	n := 0
	for _, c := range moves {
		if c.Val() == int64(1) {
			n++
		}
	}
	return n, nil
}

// wakeScaled is the retry score (a Unix second) of a task due at score,
// its moment scaled around now by k, and whether it changed. A booked task
// asks to wake wakeEarly before its moment and asynq keeps the second the
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

// providerOf reports whether msg (a task hash's msg) is a notification or
// digest of provider.
func providerOf(msg, provider string) bool {
	if msg == "" {
		return false
	}
	typ, payload, err := asynqdb.Payload([]byte(msg))
	if err != nil || typ != TypeNotify && typ != TypeDigest {
		return false
	}
	var p struct {
		Provider string `json:"provider"`
	}
	return json.Unmarshal(payload, &p) == nil && p.Provider == provider
}
