// Package digest folds the messages a digest policy holds back into one
// message per recipient, policy and provider, sent by a task of its own
// (TaskType) once the policy allows. The handler (package jobs) folds and
// sends; the model is in docs/rules.md (over_cap: digest).
package digest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// TaskType is the asynq task type of a digest's task.
const TaskType = "digest"

// Template is the template of a digest message; its data is
// {"policy": ..., "messages": [{"id", "template", "data"}, ...]}, the
// folded messages in the order they were folded.
const Template = "digest"

// TTL is how long a digest's keys live past the moment the digest is to
// go (and an attempt marker after its send): far longer than any
// redelivery (minutes) or a digest task's wait for Redis to come back.
const TTL = 8 * 24 * time.Hour

// Enqueuer puts a task on a queue (an *asynq.Client).
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// Store folds the messages a digest policy holds back into one message
// per recipient, policy and provider, in three keys (gen, ids, list:<n>)
// whose life and transactions docs/rules.md ("Digests") describes. A Store
// is safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	queue  Enqueuer
}

// New returns the digests on rdb under the throttle's key prefix (""
// means throttle.DefaultPrefix), queuing digest tasks with q.
func New(rdb redis.UniversalClient, prefix string, q Enqueuer) *Store {
	return &Store{rdb: rdb, prefix: cmp.Or(prefix, throttle.DefaultPrefix), queue: q}
}

// Ref names one digest: its recipient, policy, provider and number.
// Tenant, not part of its name, is the tenant of the fold that queued its
// task: the digest goes in that tenant's share of the provider.
type Ref struct {
	Recipient string `json:"recipient"`
	Policy    string `json:"policy"`
	Provider  string `json:"provider"`
	Gen       int64  `json:"gen"`
	Tenant    string `json:"tenant,omitempty"`
}

// digestEntry is one folded message.
type digestEntry struct {
	ID       string          `json:"id"`
	Template string          `json:"template"`
	Data     json.RawMessage `json:"data,omitempty"`
}

// TaskID is the digest's task ID: one per digest.
func (d Ref) TaskID() string {
	return message.TaskID("digest\x00" + d.Recipient + "\x00" + d.Policy + "\x00" + d.Provider + "\x00" + strconv.FormatInt(d.Gen, 10))
}

func refOf(n message.Notification) Ref {
	return Ref{Recipient: n.Recipient, Policy: n.Policy, Provider: n.Provider, Tenant: n.Tenant}
}

// Attempt records that task id is about to be sent.
func (g *Store) Attempt(ctx context.Context, id string) error {
	if err := g.rdb.Set(ctx, g.attemptKey(id), 1, TTL).Err(); err != nil {
		return fmt.Errorf("digest: mark a send attempt: %w", err)
	}
	return nil
}

// State returns the digest task id joined, if it was folded, and whether a
// send of it was attempted (Attempt).
func (g *Store) State(ctx context.Context, id string, n message.Notification) (d Ref, folded, attempted bool, err error) {
	d = refOf(n)
	_, ids, _ := g.keys(d)
	var gen *redis.StringCmd
	var tried *redis.IntCmd
	if _, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		gen, tried = p.HGet(ctx, ids, id), p.Exists(ctx, g.attemptKey(id))
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return d, false, false, fmt.Errorf("digest: digest lookup: %w", err)
	}
	attempted = tried.Val() > 0
	s, err := gen.Result()
	if errors.Is(err, redis.Nil) {
		return d, false, attempted, nil
	}
	if err != nil {
		return d, false, attempted, fmt.Errorf("digest: digest lookup: %w", err)
	}
	d.Gen, err = strconv.ParseInt(s, 10, 64)
	return d, err == nil, attempted, err
}

// Fold adds task id's message to the open digest of its recipient, policy
// and provider, once: a task already folded is left where it is. It
// returns the digest the task is in. The digest's keys live TTL past at,
// the moment it is to go, however far that is.
func (g *Store) Fold(ctx context.Context, id string, n message.Notification, at time.Time) (Ref, error) {
	d := refOf(n)
	ttl := max(time.Until(at), 0) + TTL
	gen, ids, _ := g.keys(d)
	entry, err := json.Marshal(digestEntry{ID: id, Template: n.Template, Data: n.Data})
	if err != nil {
		return d, fmt.Errorf("digest: digest entry: %w", err)
	}
	err = g.watch(ctx, func(tx *redis.Tx) error {
		if s, err := tx.HGet(ctx, ids, id).Result(); err == nil {
			d.Gen, err = strconv.ParseInt(s, 10, 64)
			return err
		} else if !errors.Is(err, redis.Nil) {
			return err
		}
		cur, err := openGen(ctx, tx, gen)
		if err != nil {
			return err
		}
		d.Gen = cur
		_, _, list := g.keys(d)
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.RPush(ctx, list, entry)
			p.HSet(ctx, ids, id, cur)
			p.Set(ctx, gen, cur, ttl)
			p.Expire(ctx, ids, ttl)
			p.Expire(ctx, list, ttl)
			return nil
		})
		return err
	}, gen, ids)
	if err != nil {
		return d, fmt.Errorf("digest: fold into a digest: %w", err)
	}
	return d, nil
}

// Schedule queues digest d's task to run at at, on queue, unless it is
// queued already (its task ID is the digest's).
func (g *Store) Schedule(ctx context.Context, d Ref, at time.Time, queue string) error {
	payload, err := json.Marshal(d)
	if err != nil {
		return err
	}
	task := asynq.NewTaskWithHeaders(TaskType, payload, message.Headers(), asynq.TaskID(d.TaskID()), asynq.Queue(queue),
		asynq.MaxRetry(message.DefaultMaxRetry), asynq.ProcessAt(at))
	_, err = g.queue.EnqueueContext(ctx, task)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("digest: queue a digest: %w", err)
	}
	return nil
}

// Seal closes digest d to folds (later ones start the next digest) and
// returns the data of its message: its policy and its messages in order,
// and how many. Sealing again changes nothing.
func (g *Store) Seal(ctx context.Context, d Ref) (json.RawMessage, int, error) {
	gen, _, _ := g.keys(d)
	err := g.watch(ctx, func(tx *redis.Tx) error {
		cur, err := openGen(ctx, tx, gen)
		if err != nil || cur != d.Gen {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, gen, cur+1, TTL)
			return nil
		})
		return err
	}, gen)
	if err != nil {
		return nil, 0, fmt.Errorf("digest: seal a digest: %w", err)
	}
	return g.read(ctx, d)
}

// watch runs fn in a transaction on keys, again while a fold or a seal
// between its reads and its writes makes it fail (a hundred times at most).
func (g *Store) watch(ctx context.Context, fn func(*redis.Tx) error, keys ...string) error {
	var err error
	for range 100 {
		if err = g.rdb.Watch(ctx, fn, keys...); !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	return err
}

// openGen reads gen, the number of the open digest (absent: 1).
func openGen(ctx context.Context, tx *redis.Tx, gen string) (int64, error) {
	cur, err := tx.Get(ctx, gen).Int64()
	if errors.Is(err, redis.Nil) {
		return 1, nil
	}
	return cur, err
}

// Size returns how many messages digest d holds.
func (g *Store) Size(ctx context.Context, d Ref) (int64, error) {
	_, _, list := g.keys(d)
	return g.rdb.LLen(ctx, list).Result()
}

// read returns the data of digest d's message (see Seal).
func (g *Store) read(ctx context.Context, d Ref) (json.RawMessage, int, error) {
	_, _, list := g.keys(d)
	entries, err := g.rdb.LRange(ctx, list, 0, -1).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("digest: read a digest: %w", err)
	}
	msgs := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		msgs[i] = json.RawMessage(e)
	}
	data, err := json.Marshal(struct {
		Policy   string            `json:"policy"`
		Messages []json.RawMessage `json:"messages"`
	}{d.Policy, msgs})
	return data, len(entries), err
}

// Drop deletes digest d's messages once it was sent. The folded IDs stay
// until their TTL: a folded task delivered again must still find itself.
func (g *Store) Drop(ctx context.Context, d Ref) error {
	_, _, list := g.keys(d)
	return g.rdb.Del(ctx, list).Err()
}
