package jobs

// Delivering a job: the send through its provider, and settling its
// admission by the outcome (the sent marker, or what it took given back).

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// holds returns nil if j may be sent here, and otherwise the deferral that
// leaves it to the worker it was handed to. What j's admission took stays:
// it belongs to the task ID, which that worker's admission found its own.
// The error makes asynq retry the task rather than delete it, should the
// other worker still be running it (see internal/asynqdb, item 5).
func (t *Throttle) holds(ctx context.Context, j *job) error {
	if t.Fleet == nil {
		return nil
	}
	err := t.Fleet.Holds(ctx)
	if err == nil {
		return nil
	}
	t.Log.Warn("not sending: the task may have been handed to another worker while this one was silent",
		"task", j.id, "recipient", message.Redact(j.n.Recipient), "err", err)
	return &Deferral{Delay: handedOverDelay, Reason: "handed over: " + err.Error()}
}

// deliver sends j's message through its provider and settles the
// admission by the outcome.
func (t *Throttle) deliver(ctx context.Context, j *job) error {
	if err := t.onTime(ctx, j); err != nil {
		return err
	}
	id, err := j.route.Provider.Send(ctx, providers.Message{ID: j.id, Recipient: j.n.Recipient, Template: j.n.Template, Data: j.n.Data})
	if err == nil {
		if j.route.Bucket != nil {
			t.Limiter.Sent(j.route.Bucket, j.n.Provider, 1)
		}
		t.Metrics.inc(t.Metrics.Sent, j.n.Provider)
		t.Metrics.inc(t.Metrics.TenantSent, j.n.Provider, t.tenantLabel(j.n.Tenant))
		t.markSent(ctx, j)
		t.logSent(j, id)
		return nil
	}
	t.Metrics.inc(t.Metrics.Failed, j.n.Provider)
	// The recipient received nothing: its quota goes back in every case.
	t.release(j.recipientOnly())
	o, after := outcome(err)
	if o != providers.Reject {
		// The provider's token was spent on this attempt (it took the
		// request, or may have): a retry takes a token of its own, so that
		// retries are paced like any other send rather than passing the
		// bucket as already admitted.
		t.forget(j.request())
	}
	if handled, err := t.settle(ctx, j, err); handled {
		return err
	}
	switch o {
	case providers.Pause:
		t.Metrics.inc(t.Metrics.Paused, j.n.Provider)
		if _, perr := t.Limiter.Pause(context.WithoutCancel(ctx), j.route.Bucket, j.n.Provider, after); perr != nil {
			t.Log.Warn("pausing provider failed", "provider", j.n.Provider, "err", perr)
		}
		t.Log.Warn("provider asked to pause", "provider", j.n.Provider, "for", after, "task", j.id)
		return t.deferTo(j, after, false, fmt.Sprintf("provider %s paused: %v; next try in %s", j.n.Provider, err, shortDuration(after)))
	case providers.Reject:
		t.Metrics.inc(t.Metrics.Archived, "rejected")
		return t.logArchived(j.id, "rejected by the provider", fmt.Errorf("rejected: %v: %w", err, asynq.SkipRetry))
	default:
		t.Log.Warn("send failed; will retry", "task", j.id, "err", err)
		return err
	}
}

// markPatience bounds how long markSent keeps trying to write a marker
// while Redis is unreachable.
const markPatience = 10 * time.Minute

// markSent records that j was sent. A failure is logged and counted, not
// returned: the send succeeded, and an error would have asynq retry it.
// While Redis is unreachable it keeps trying (see outage.go) until Redis
// answers, the worker stops, or markPatience passes, even after the task's
// context ends: a task whose lease expired meanwhile is redelivered a
// minute or more after Redis is back, and the marker, written as soon as
// Redis answers, is there first.
func (t *Throttle) markSent(ctx context.Context, j *job) {
	if t.Sent == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markPatience)
	defer cancel()
	tries := 0
	err := untilAnswered(ctx, t.Stopping, func() error {
		tries++
		return t.Sent.Mark(ctx, j.id, time.Now())
	})
	switch {
	case err != nil:
		t.Metrics.inc(t.Metrics.Unmarked, j.n.Provider)
		t.Log.Warn("sent, but the sent marker failed: a redelivery would send it again", "task", j.id, "err", err)
	case tries > 1:
		t.Log.Info("sent marker written once Redis answered", "task", j.id, "tries", tries)
	}
}

// release gives back an admission; failures are logged, since the entries
// then expire on their own and a retry of the task finds them its own.
func (t *Throttle) release(r throttle.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := t.Limiter.Release(ctx, r)
	if err != nil {
		t.Log.Warn("release failed", "task", r.ID, "err", err)
	}
	if n > 0 {
		t.Metrics.inc(t.Metrics.Bookings, "released")
	}
}

// forget drops the task's provider token without giving it back (see
// throttle.Limiter.Forget). A failure is logged: the retry then passes the
// bucket as already admitted, and the holding lapses after
// throttle.Options.Remember.
func (t *Throttle) forget(r throttle.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := t.Limiter.Forget(ctx, r); err != nil {
		t.Log.Warn("forgetting the provider token failed", "task", r.ID, "err", err)
	}
}

// tenantLabel is a tenant's label in the metrics: its name if the weights
// name it, "default" for none, else "other" (a bounded set of series).
func (t *Throttle) tenantLabel(tenant string) string {
	if tenant == "" {
		return "default"
	}
	if _, ok := t.rules().Weights[tenant]; ok {
		return tenant
	}
	return "other"
}
