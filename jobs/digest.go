package jobs

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
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

// TypeDigest is the asynq task type of a digest: the messages of one
// recipient, policy and provider that were over the policy's cap, folded
// into one message (see Digests).
const TypeDigest = "digest"

// DigestTemplate is the template of a digest message; its data is
// {"policy": ..., "messages": [{"id", "template", "data"}, ...]}, the
// folded messages in the order they were folded.
const DigestTemplate = "digest"

// DefaultDigestTTL is how long a digest's keys live past the moment the
// digest is to go (and an attempt marker after its send) unless
// Digests.TTL says otherwise: far longer than any redelivery (minutes) or
// a digest task's wait for Redis to come back.
const DefaultDigestTTL = 8 * 24 * time.Hour

// Enqueuer puts a task on a queue (an *asynq.Client).
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// Digests folds the messages a digest policy holds back into one message
// per recipient, policy and provider. Its state, in three keys of one hash
// slot per (recipient, policy, provider), is:
//
//   - gen: the number of the open digest, which folds join (absent: 1);
//   - ids: a hash of every folded task ID to the digest it joined, so that
//     a folded task delivered again (a crash after the fold) is found folded
//     and never sent on its own nor folded twice;
//   - list:<n>: digest n's messages, in the order they were folded.
//
// A fold joins the open digest and makes sure its task (TypeDigest, one
// task ID per digest) is queued for the moment the policy allows. That task
// admits the digest like any message; once it may go it seals the digest
// (gen moves on, so later folds start the next one), reads it and sends it.
// Fold and seal are transactions on gen, so each message is in exactly one
// digest. A Digests is safe for concurrent use.
type Digests struct {
	rdb    redis.UniversalClient
	prefix string
	queue  Enqueuer
	// TTL is how long a digest's keys live after their last change.
	// Default DefaultDigestTTL.
	TTL time.Duration
}

// NewDigests returns the digests on rdb under the throttle's key prefix (""
// means throttle.DefaultPrefix), queuing digest tasks with q.
func NewDigests(rdb redis.UniversalClient, prefix string, q Enqueuer) *Digests {
	if prefix == "" {
		prefix = throttle.DefaultPrefix
	}
	return &Digests{rdb: rdb, prefix: prefix, queue: q, TTL: DefaultDigestTTL}
}

// digestOf names one digest: its recipient, policy, provider and number.
// Tenant, not part of its name, is the tenant of the fold that queued its
// task: the digest goes in that tenant's share of the provider.
type digestOf struct {
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

// keys returns the digest's keys: gen, ids and its list.
func (g *Digests) keys(d digestOf) (gen, ids, list string) {
	sum := sha1.Sum([]byte(d.Recipient + "\x00" + d.Policy + "\x00" + d.Provider))
	base := g.prefix + "digest:{" + hex.EncodeToString(sum[:10]) + "}:"
	return base + "gen", base + "ids", base + "list:" + strconv.FormatInt(d.Gen, 10)
}

// taskID is the digest's task ID: one per digest.
func (d digestOf) taskID() string {
	return message.TaskID("digest\x00" + d.Recipient + "\x00" + d.Policy + "\x00" + d.Provider + "\x00" + strconv.FormatInt(d.Gen, 10))
}

func digestFor(n message.Notification) digestOf {
	return digestOf{Recipient: n.Recipient, Policy: n.Policy, Provider: n.Provider, Tenant: n.Tenant}
}

// attemptKey is the key of task id's attempt marker: a send of it was
// tried, and the provider may have taken it.
func (g *Digests) attemptKey(id string) string { return g.prefix + "attempt:{" + id + "}" }

// attempt records that task id is about to be sent.
func (g *Digests) attempt(ctx context.Context, id string) error {
	if err := g.rdb.Set(ctx, g.attemptKey(id), 1, g.ttl()).Err(); err != nil {
		return fmt.Errorf("jobs: mark a send attempt: %w", err)
	}
	return nil
}

// state returns the digest task id joined, if it was folded, and whether a
// send of it was attempted (see attempt).
func (g *Digests) state(ctx context.Context, id string, n message.Notification) (d digestOf, folded, attempted bool, err error) {
	d = digestFor(n)
	_, ids, _ := g.keys(d)
	var gen *redis.StringCmd
	var tried *redis.IntCmd
	if _, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		gen, tried = p.HGet(ctx, ids, id), p.Exists(ctx, g.attemptKey(id))
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return d, false, false, fmt.Errorf("jobs: digest lookup: %w", err)
	}
	attempted = tried.Val() > 0
	s, err := gen.Result()
	if errors.Is(err, redis.Nil) {
		return d, false, attempted, nil
	}
	if err != nil {
		return d, false, attempted, fmt.Errorf("jobs: digest lookup: %w", err)
	}
	d.Gen, err = strconv.ParseInt(s, 10, 64)
	return d, err == nil, attempted, err
}

// fold adds task id's message to the open digest of its recipient, policy
// and provider, once: a task already folded is left where it is. It
// returns the digest the task is in. The digest's keys live TTL past at,
// the moment it is to go, however far that is.
func (g *Digests) fold(ctx context.Context, id string, n message.Notification, at time.Time) (digestOf, error) {
	d := digestFor(n)
	ttl := max(time.Until(at), 0) + g.ttl()
	gen, ids, _ := g.keys(d)
	entry, err := json.Marshal(digestEntry{ID: id, Template: n.Template, Data: n.Data})
	if err != nil {
		return d, fmt.Errorf("jobs: digest entry: %w", err)
	}
	for range 100 { // a seal between the read and the write starts over
		err = g.rdb.Watch(ctx, func(tx *redis.Tx) error {
			if s, err := tx.HGet(ctx, ids, id).Result(); err == nil {
				d.Gen, err = strconv.ParseInt(s, 10, 64)
				return err
			} else if !errors.Is(err, redis.Nil) {
				return err
			}
			cur, err := tx.Get(ctx, gen).Int64()
			if errors.Is(err, redis.Nil) {
				cur, err = 1, nil
			}
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
		if !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	if err != nil {
		return d, fmt.Errorf("jobs: fold into a digest: %w", err)
	}
	return d, nil
}

// schedule queues digest d's task to run at at, on queue, unless it is
// queued already (its task ID is the digest's).
func (g *Digests) schedule(ctx context.Context, d digestOf, at time.Time, queue string) error {
	payload, err := json.Marshal(d)
	if err != nil {
		return err
	}
	task := asynq.NewTaskWithHeaders(TypeDigest, payload, message.Headers(), asynq.TaskID(d.taskID()), asynq.Queue(queue),
		asynq.MaxRetry(message.DefaultMaxRetry), asynq.ProcessAt(at))
	_, err = g.queue.EnqueueContext(ctx, task)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("jobs: queue a digest: %w", err)
	}
	return nil
}

// seal closes digest d to folds: later ones start the next digest. Sealing
// again changes nothing.
func (g *Digests) seal(ctx context.Context, d digestOf) error {
	gen, _, _ := g.keys(d)
	var err error
	for range 100 {
		err = g.rdb.Watch(ctx, func(tx *redis.Tx) error {
			cur, err := tx.Get(ctx, gen).Int64()
			if errors.Is(err, redis.Nil) {
				cur, err = 1, nil
			}
			if err != nil || cur != d.Gen {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, gen, cur+1, g.ttl())
				return nil
			})
			return err
		}, gen)
		if !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("jobs: seal a digest: %w", err)
	}
	return nil
}

// size returns how many messages digest d holds.
func (g *Digests) size(ctx context.Context, d digestOf) (int64, error) {
	_, _, list := g.keys(d)
	return g.rdb.LLen(ctx, list).Result()
}

// message returns the data of digest d's message: its policy and its
// messages in order.
func (g *Digests) message(ctx context.Context, d digestOf) (json.RawMessage, int, error) {
	_, _, list := g.keys(d)
	entries, err := g.rdb.LRange(ctx, list, 0, -1).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("jobs: read a digest: %w", err)
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

// drop deletes digest d's messages once it was sent. The folded IDs stay
// until their TTL: a folded task delivered again must still find itself.
func (g *Digests) drop(ctx context.Context, d digestOf) error {
	_, _, list := g.keys(d)
	return g.rdb.Del(ctx, list).Err()
}

func (g *Digests) ttl() time.Duration {
	if g.TTL > 0 {
		return g.TTL
	}
	return DefaultDigestTTL
}

// foldedBefore returns errFolded when j's task was folded into a digest by
// an earlier delivery (it crashed after the fold): the digest's task is
// queued again if it is gone, and j is not sent on its own. A task an
// earlier delivery tried to send (it crashed in the send) is marked tried:
// the provider may have it, so it is never folded.
func (t *Throttle) foldedBefore(ctx context.Context, j *job) error {
	d, ok, attempted, err := t.Digests.state(ctx, j.id, j.n)
	j.tried = j.tried || attempted
	if err == nil && ok {
		err = t.Digests.schedule(ctx, d, time.Now(), j.queue)
		if err == nil {
			t.Log.Info("folded before: completing", "task", j.id, "digest", d.taskID())
			return errFolded
		}
	}
	if err != nil {
		t.Log.Warn("digest lookup failed", "task", j.id, "err", err)
		return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
	}
	return nil
}

// fold folds j, which its policy holds back until at, into the open digest
// of its recipient, policy and provider, and queues that digest's task for
// at. It returns errFolded, or the deferral that retries the fold (a
// retry finds the task folded if the fold was made).
func (t *Throttle) fold(ctx context.Context, j job, at time.Time) error {
	d, err := t.Digests.fold(ctx, j.id, j.n, at)
	if err == nil {
		err = t.Digests.schedule(ctx, d, at, j.queue)
	}
	if err != nil {
		t.Log.Warn("fold failed", "task", j.id, "err", err)
		return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
	}
	t.Metrics.inc(t.Metrics.Folded, j.n.Policy)
	t.logFolded(&j, d.taskID(), at)
	return errFolded
}

// sendDigest runs a digest's task: admitted like any message of its
// policy and provider (deferred, never folded), then sealed, read and sent
// as one message, DigestTemplate, whose ID is the task's.
func (t *Throttle) sendDigest(ctx context.Context, id string, task *asynq.Task) error {
	var d digestOf
	if err := json.Unmarshal(task.Payload(), &d); err != nil || t.Digests == nil {
		t.Metrics.inc(t.Metrics.Archived, "malformed")
		return t.logArchived(id, "malformed", fmt.Errorf("malformed digest (or digests off): %v: %w", err, asynq.SkipRetry))
	}
	j, err := t.route(ctx, id, message.Notification{Recipient: d.Recipient, Policy: d.Policy, Provider: d.Provider, Template: DigestTemplate, Tenant: d.Tenant})
	if err != nil {
		t.Metrics.inc(t.Metrics.Archived, "malformed")
		return t.logArchived(id, "malformed", fmt.Errorf("malformed digest: %v: %w", err, asynq.SkipRetry))
	}
	// A digest waits for its moment like any message: it is never folded,
	// dropped or expired, which would lose what it carries.
	j.policy.Digest, j.policy.Drop, j.policy.MaxDelay = false, false, 0
	j.book, j.headers = t.Book, task.Headers()
	if n, err := t.Digests.size(ctx, d); err != nil {
		return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
	} else if n == 0 {
		return nil // sent already, and a folded task queued it again
	}
	if err := t.admit(ctx, &j); err != nil {
		if errors.Is(err, errSentBefore) {
			_ = t.Digests.drop(ctx, d)
		}
		return ignoreDone(err)
	}
	var count int
	err = t.Digests.seal(ctx, d)
	if err == nil {
		j.n.Data, count, err = t.Digests.message(ctx, d)
	}
	if err != nil {
		t.release(j.request())
		return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
	}
	if err := t.holds(ctx, &j); err != nil {
		return err
	}
	// A dead address gets no digest either; a held scope holds it too.
	if err := t.screen(ctx, &j); err != nil {
		return err
	}
	if err := t.deliver(ctx, &j); err != nil {
		return err
	}
	t.Log.Debug("digest sent", "task", id, "recipient", message.Redact(d.Recipient), "policy", d.Policy, "messages", count)
	if err := t.Digests.drop(ctx, d); err != nil {
		t.Log.Warn("sent digest not deleted: it expires", "task", id, "err", err)
	}
	return nil
}
