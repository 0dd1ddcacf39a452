package fleet

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// A change of a provider's rate or a tenant's weight moves the moments of
// the work waiting on it (the engine's part: throttle.Limiter.Repace and
// Reweigh); the tasks waiting for those moments in asynq's retry sets,
// each scored by its moment (wake.go), move with them. Rescale reads every
// waiting task once per change, never per message.

//go:embed rescale.lua
var rescaleLua string

var rescaleScript = redis.NewScript(rescaleLua)

// rescaleBatch is how many waiting tasks a read takes per round trip.
const rescaleBatch = 500

// Waiting is a task waiting in a queue's retry set: its ID, its score (its
// moment, in seconds, Lead before it where a worker wrote it) and its
// message (asynq's task hash's msg).
type Waiting struct {
	Queue, ID string
	Score     float64
	Msg       string
}

// Scan calls each with the tasks waiting in queues' retry sets,
// rescaleBatch at a time: one read of each task's message.
func Scan(ctx context.Context, rdb redis.UniversalClient, queues []string, each func([]Waiting) error) error {
	for _, q := range queues {
		retry := asynqdb.RetryKey(q)
		for start := int64(0); ; start += rescaleBatch {
			z, err := rdb.ZRangeWithScores(ctx, retry, start, start+rescaleBatch-1).Result()
			if err != nil {
				return fmt.Errorf("fleet: read %s: %w", retry, err)
			}
			if len(z) == 0 {
				break
			}
			reads := make([]*redis.StringCmd, len(z))
			_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, e := range z {
					reads[i] = p.HGet(ctx, asynqdb.TaskKey(q, e.Member.(string)), "msg")
				}
				return nil
			})
			if err != nil && err != redis.Nil {
				return fmt.Errorf("fleet: read the tasks of %s: %w", q, err)
			}
			ws := make([]Waiting, len(z))
			for i, e := range z {
				ws[i] = Waiting{Queue: q, ID: e.Member.(string), Score: e.Score, Msg: reads[i].Val()}
			}
			if err := each(ws); err != nil {
				return err
			}
			if len(z) < rescaleBatch {
				break
			}
		}
	}
	return nil
}

// Rescale moves the moment of each task of ws around now by the factor k
// gives it (1: it stays), as the engine moved the work it waits for:
// t becomes now + (t - now) k. A task that moved on since it was read
// stays. It returns how many moved.
func Rescale(ctx context.Context, rdb redis.UniversalClient, ws []Waiting, now time.Time, k func(Waiting) float64) (int, error) {
	if len(ws) == 0 {
		return 0, nil
	}
	if err := rescaleScript.Load(ctx, rdb).Err(); err != nil {
		return 0, fmt.Errorf("fleet: rescale: load the script: %w", err)
	}
	var moves []*redis.Cmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, w := range ws {
			f := k(w)
			if f == 1 {
				continue
			}
			if score, ok := scaled(w.Score, now, f); ok {
				moves = append(moves, rescaleScript.EvalSha(ctx, p, []string{asynqdb.RetryKey(w.Queue)}, w.ID, w.Score, score))
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("fleet: rescale: %w", err)
	}
	n := 0
	for _, m := range moves {
		if m.Val() == int64(1) {
			n++
		}
	}
	return n, nil
}

// scaled is a retry score (seconds) moved around now by k, to the ms, and
// whether it moved: scores up to now stay.
func scaled(score float64, now time.Time, k float64) (float64, bool) {
	at := now.UnixMilli()
	ms := int64(math.Round(score * 1000))
	if ms <= at {
		return score, false
	}
	moved := at + int64(math.Ceil(float64(ms-at)*k))
	return float64(moved) / 1000, moved != ms
}
