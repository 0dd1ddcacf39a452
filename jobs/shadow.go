package jobs

// Shadow mode: rules that count and report what they would have done, and
// hold nothing back.

import (
	"context"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// shadowPolicy reports what j's policy in shadow mode would have done,
// from its admission d: the policy's takes are in shadow mode
// (throttle.Take.Shadow), so the admission that counted them said, in the
// same atomic step, whether one would have held j back and for how long.
// Messages racing on one recipient each see the ones before them.
func (t *Throttle) shadowPolicy(j *job, d *throttle.Decision) {
	if !j.policy.Shadow || d.Shadow < 0 {
		return
	}
	take := j.request().Takes[d.Shadow]
	would := throttle.Decision{Outcome: throttle.Denied, Now: d.Now, Delay: d.ShadowDelay, TakeIndex: d.Shadow,
		Rule: take.Rule, Subject: take.Subject, Limit: take.Rule.String()}
	t.shadowed(j, &would, nil, j.policy.Drop && j.overCap(d.Shadow)) // quiet hours never drop
}

// shadowBucket reports what j's provider in shadow mode would have done: a
// bucket, which must count j to know about the next, is taken on a subject
// of its own, "shadow:" and the provider, never the one real sends take.
// Nothing changes for j; a failure is only logged.
func (t *Throttle) shadowBucket(ctx context.Context, j *job) {
	if !j.route.Shadow {
		return
	}
	r := throttle.Request{ID: j.id, MaxWait: t.InlineWait,
		Takes: []throttle.Take{{Rule: j.route.Bucket, Subject: "shadow:" + j.n.Provider}}}
	d, err := t.Limiter.Admit(ctx, r)
	t.shadowed(j, &d, err, false)
}

// shadowed reports a shadow decision d about j.
func (t *Throttle) shadowed(j *job, d *throttle.Decision, err error, drop bool) {
	if err != nil {
		t.Log.Warn("shadow check failed", "task", j.id, "err", err)
		return
	}
	if d.Allowed() {
		return
	}
	would := "deferred"
	if dl, _ := j.deadline(); drop {
		would = "dropped"
	} else if !dl.IsZero() && d.At().After(dl) {
		would = "expired"
	}
	rule := t.denier(j, d)
	t.Metrics.inc(t.Metrics.Shadow, rule, would)
	t.Log.Info("shadow: would have "+would, "task", j.id, "recipient", message.Redact(j.n.Recipient), "rule", rule, "for", shortDuration(d.Delay))
}
