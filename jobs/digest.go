package jobs

// Digests as the handler runs them (see package digest): a job its policy
// folds, a redelivered job found folded, and the digest's own task.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/message"
)

// foldedBefore returns errFolded when j's task was folded into a digest by
// an earlier delivery (it crashed after the fold): the digest's task is
// queued again if it is gone, and j is not sent on its own. A task an
// earlier delivery tried to send (it crashed in the send) is marked tried:
// the provider may have it, so it is never folded.
func (t *Throttle) foldedBefore(ctx context.Context, j *job) error {
	d, ok, attempted, err := t.Digests.State(ctx, j.id, j.n)
	j.tried = j.tried || attempted
	if err == nil && ok {
		err = t.Digests.Schedule(ctx, d, time.Now(), j.queue)
		if err == nil {
			t.Log.Info("folded before: completing", "task", j.id, "digest", d.TaskID())
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
	d, err := t.Digests.Fold(ctx, j.id, j.n, at)
	if err == nil {
		err = t.Digests.Schedule(ctx, d, at, j.queue)
	}
	if err != nil {
		t.Log.Warn("fold failed", "task", j.id, "err", err)
		return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
	}
	t.Metrics.inc(t.Metrics.Folded, j.n.Policy)
	t.logFolded(&j, d.TaskID(), at)
	return errFolded
}

// sendDigest runs a digest's task: admitted like any message of its
// policy and provider (deferred, never folded), then sealed, read and sent
// as one message, digest.Template, whose ID is the task's.
func (t *Throttle) sendDigest(ctx context.Context, id string, task *asynq.Task) error {
	var d digest.Ref
	if err := json.Unmarshal(task.Payload(), &d); err != nil || t.Digests == nil {
		t.Metrics.inc(t.Metrics.Archived, "malformed")
		return t.logArchived(id, "malformed", fmt.Errorf("malformed digest (or digests off): %v: %w", err, asynq.SkipRetry))
	}
	j, err := t.route(ctx, id, message.Notification{Recipient: d.Recipient, Policy: d.Policy, Provider: d.Provider, Template: digest.Template, Tenant: d.Tenant})
	if err != nil {
		t.Metrics.inc(t.Metrics.Archived, "malformed")
		return t.logArchived(id, "malformed", fmt.Errorf("malformed digest: %v: %w", err, asynq.SkipRetry))
	}
	// A digest waits for its moment like any message: it is never folded,
	// dropped or expired, which would lose what it carries.
	j.policy.Digest, j.policy.Drop, j.policy.MaxDelay = false, false, 0
	j.book, j.headers = t.Book, task.Headers()
	if n, err := t.Digests.Size(ctx, d); err != nil {
		return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
	} else if n == 0 {
		return nil // sent already, and a folded task queued it again
	}
	if err := t.admit(ctx, &j); err != nil {
		if errors.Is(err, errSentBefore) {
			_ = t.Digests.Drop(ctx, d)
		}
		return ignoreDone(err)
	}
	var count int
	if j.n.Data, count, err = t.Digests.Seal(ctx, d); err != nil {
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
	if err := t.Digests.Drop(ctx, d); err != nil {
		t.Log.Warn("sent digest not deleted: it expires", "task", id, "err", err)
	}
	return nil
}
