package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
)

// What Throttle does around a send through a providers.Scoper (see Screen):
// screen the message before, and act after on the outcomes that need more
// than deliver's switch (a scoped pause, a moment to retry at, a dead
// address, broken credentials). Each is reached by one hook in handler.go.

// screen returns nil if j may be sent, and otherwise the error that archives
// it (its recipient is suppressed) or defers it (one of its scopes is held).
// Either way what its admission took is given back. A Screen that cannot
// answer defers the job, as an admission that cannot does.
func (t *Throttle) screen(ctx context.Context, j *job) error {
	sc, ok := j.route.Provider.(providers.Scoper)
	if !ok || t.Screen == nil {
		return nil
	}
	sup, hold, err := t.Screen.Check(ctx, j.n.Provider, j.n.Recipient, sc.Scopes(j.message()))
	switch {
	case err != nil:
		t.release(j.request())
		t.Log.Warn("screen failed", "task", j.id, "err", err)
		return &Deferral{Delay: 5 * time.Second, Reason: "screen unavailable: " + err.Error()}
	case sup != nil:
		t.release(j.request())
		t.Metrics.inc(t.Metrics.Archived, "suppressed")
		t.Log.Info("archived without sending: address suppressed", "task", j.id, "provider", j.n.Provider,
			"recipient", message.Redact(j.n.Recipient), "reason", sup.Reason)
		return fmt.Errorf("suppressed by provider %s since %s: %s: %w",
			j.n.Provider, sup.At.Format(time.RFC3339), sup.Reason, asynq.SkipRetry)
	case hold > 0:
		t.release(j.request())
		t.Metrics.inc(t.Metrics.Deferred, "provider "+j.n.Provider+" (scoped pause)")
		return t.deferTo(j, hold, false, fmt.Sprintf("provider %s holds a scope of this message; next try in %s", j.n.Provider, shortDuration(hold)))
	}
	return nil
}

// message is what j's provider is given.
func (j *job) message() providers.Message {
	return providers.Message{ID: j.id, Recipient: j.n.Recipient, Template: j.n.Template, Data: j.n.Data}
}

// settle acts on a failed send's outcome where deliver's own switch does
// not: it reports whether it did, with the task's error, or false to leave
// err to deliver. The recipient's quota was given back and the provider
// token spent already.
func (t *Throttle) settle(ctx context.Context, j *job, err error) (bool, error) {
	var se *providers.SendError
	if !errors.As(err, &se) {
		return false, nil
	}
	ctx = context.WithoutCancel(ctx)
	switch {
	case se.Outcome == providers.Pause && se.Scope != "":
		return true, t.holdScope(ctx, j, se)
	case se.Outcome == providers.Pause && !se.RetryAt.IsZero():
		return true, t.pauseProvider(ctx, j, se, se.RetryAfter)
	case se.Outcome == providers.Retry && (se.RetryAfter > 0 || !se.RetryAt.IsZero()):
		after := t.wait(ctx, se)
		t.Log.Info("provider said when to retry", "task", j.id, "provider", j.n.Provider, "in", after)
		return true, t.deferTo(j, after, false, fmt.Sprintf("provider %s: %v; next try in %s", j.n.Provider, err, shortDuration(after)))
	case se.Outcome == providers.Dead:
		return true, t.suppress(ctx, j, se)
	case se.Outcome == providers.Broken:
		t.Metrics.inc(t.Metrics.Broken, j.n.Provider)
		t.Log.Error("provider credentials or account broken: pausing it fleet-wide; fix its configuration",
			"provider", j.n.Provider, "task", j.id, "err", err)
		return true, t.pauseProvider(ctx, j, se, providers.BrokenPause)
	}
	return false, nil
}

// wait is how long se asks to wait: until RetryAt by Redis's clock, else
// RetryAfter.
func (t *Throttle) wait(ctx context.Context, se *providers.SendError) time.Duration {
	if se.RetryAt.IsZero() || t.Screen == nil {
		return max(se.RetryAfter, time.Millisecond)
	}
	d, err := t.Screen.Until(ctx, se.RetryAt)
	if err != nil {
		return max(time.Until(se.RetryAt), time.Second)
	}
	return d
}

// holdScope pauses the scope se names and defers j to its end.
func (t *Throttle) holdScope(ctx context.Context, j *job, se *providers.SendError) error {
	after := t.wait(ctx, se)
	if t.Screen != nil {
		if err := t.Screen.Hold(ctx, j.n.Provider, se.Scope, after, se.RetryAt); err != nil {
			t.Log.Warn("holding a scope failed", "provider", j.n.Provider, "err", err)
		}
	}
	t.Metrics.inc(t.Metrics.Held, j.n.Provider, providers.ScopeKind(se.Scope))
	t.Log.Warn("provider asked to pause one scope", "provider", j.n.Provider, "scope", providers.ScopeKind(se.Scope), "for", after, "task", j.id)
	return t.deferTo(j, after, false, fmt.Sprintf("provider %s paused %s: %v; next try in %s", j.n.Provider, providers.ScopeKind(se.Scope), se.Err, shortDuration(after)))
}

// pauseProvider pauses j's whole provider fleet-wide for se's wait (or
// fallback when it gives none) and defers j to its end.
func (t *Throttle) pauseProvider(ctx context.Context, j *job, se *providers.SendError, fallback time.Duration) error {
	after := fallback
	if se.RetryAfter > 0 || !se.RetryAt.IsZero() {
		after = t.wait(ctx, se)
	}
	t.Metrics.inc(t.Metrics.Paused, j.n.Provider)
	if _, err := t.Limiter.Pause(ctx, j.route.Bucket, j.n.Provider, after); err != nil {
		t.Log.Warn("pausing provider failed", "provider", j.n.Provider, "err", err)
	}
	t.Log.Warn("provider paused", "provider", j.n.Provider, "for", after, "task", j.id)
	return t.deferTo(j, after, false, fmt.Sprintf("provider %s paused: %v; next try in %s", j.n.Provider, se.Err, shortDuration(after)))
}

// suppress records j's recipient as dead for its provider and archives j.
func (t *Throttle) suppress(ctx context.Context, j *job, se *providers.SendError) error {
	if t.Screen != nil {
		if err := t.Screen.Suppress(ctx, j.n.Provider, j.n.Recipient, se.Err.Error(), time.Now()); err != nil {
			t.Log.Warn("suppressing a dead address failed", "provider", j.n.Provider, "err", err)
		}
	}
	t.Metrics.inc(t.Metrics.Archived, "dead_address")
	t.Log.Warn("dead address: archived and suppressed", "task", j.id, "provider", j.n.Provider, "recipient", message.Redact(j.n.Recipient), "err", se.Err)
	return fmt.Errorf("dead address: %v: %w", se.Err, asynq.SkipRetry)
}
