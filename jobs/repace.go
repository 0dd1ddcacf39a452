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
// file) leaves the work waiting on it on its old pace: its booked slots and
// tenants' lines in Redis, and the wake-ups of the tasks placed in line in
// asynq. Repace moves both to the new rate: the throttle scales the moments
// it holds around now (throttle.Limiter.Repace), and the tasks placed in
// line get their places and wake-ups scaled the same way, so a raised rate
// drains what waits at the new pace at once and a lowered one spreads it
// out, each task coming back once. The scan of the retry sets costs one
// read per waiting task, once per change, never per message.

//go:embed repace.lua
var repaceSource string

var repaceScript = redis.NewScript(repaceSource)

// repaceBatch is how many waiting tasks the scan reads per round trip.
const repaceBatch = 500

// Repace moves the waiting work of each provider whose rate changed to its
// new rate (see above), looking for placed tasks in queues; rdb is asynq's
// Redis. It returns how many tasks it moved. Every worker may call it after
// a reload: only the first to reach a provider's bucket scales its work.
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
			"factor", strconv.FormatFloat(k, 'g', 4, 64), "placed_tasks_moved", n)
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// repaceQueued scales the places (and wake-ups) of provider's tasks placed
// in line in queues around now by k.
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

// repaceBatchOf moves the tasks of z (members of queue q's retry set) that
// are provider's and placed in line.
func repaceBatchOf(ctx context.Context, rdb redis.UniversalClient, q string, z []redis.Z, provider string, now time.Time, k float64) (int, error) {
	if len(z) == 0 {
		return 0, nil
	}
	if err := repaceScript.Load(ctx, rdb).Err(); err != nil {
		return 0, fmt.Errorf("jobs: repace %s: load the script: %w", provider, err)
	}
	reads := make([]*redis.SliceCmd, len(z))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range z {
			reads[i] = p.HMGet(ctx, asynqdb.TaskKey(q, e.Member.(string)), "msg", asynqdb.PlaceField)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("jobs: repace %s: read tasks of %s: %w", provider, q, err)
	}
	var moves []*redis.Cmd
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range z {
			id, v := e.Member.(string), reads[i].Val()
			place, ok := placeOf(v, provider)
			if !ok {
				continue
			}
			at := time.UnixMicro(place)
			to := throttle.Scale(at, now, k)
			if to.Equal(at) {
				continue
			}
			score := int64(math.Round(e.Score + to.Sub(at).Seconds()))
			moves = append(moves, repaceScript.EvalSha(ctx, p, []string{asynqdb.TaskKey(q, id), asynqdb.RetryKey(q)},
				id, v[1], to.UnixMicro(), score))
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

// placeOf returns the place noted in a task's hash (HMGET msg, place) if
// the task is a notification or digest of provider placed in line.
func placeOf(v []any, provider string) (int64, bool) {
	msg, _ := v[0].(string)
	s, _ := v[1].(string)
	if msg == "" || s == "" {
		return 0, false
	}
	place, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false
	}
	typ, payload, err := asynqdb.Payload([]byte(msg))
	if err != nil || typ != TypeNotify && typ != TypeDigest {
		return 0, false
	}
	var p struct {
		Provider string `json:"provider"`
	}
	if json.Unmarshal(payload, &p) != nil || p.Provider != provider {
		return 0, false
	}
	return place, true
}
