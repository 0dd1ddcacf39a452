package jobs

// Shadow mode: rules that count and report what they would have done, and
// hold nothing back.

import (
	"context"

	"github.com/notify-throttle/throttler/throttle"
)

// shadow reports what the rules of j in shadow mode would have done with
// it, logged and counted when one would have held it back. A policy is
// asked without writing (Limiter.Check: its real take counted j already,
// or will); a bucket, which must count j to know about the next, is taken
// on a subject of its own, "shadow:" and the provider, never the one real
// sends take. Nothing changes for j; a failure is only logged.
func (t *Throttle) shadow(ctx context.Context, j *job) {
	if j.policy.Shadow {
		r := throttle.Request{ID: j.id, Takes: j.local}
		if j.quota != nil {
			r.Takes = append([]throttle.Take{{Rule: j.quota, Subject: j.n.Recipient}}, j.local...)
		}
		d, err := t.Limiter.Check(ctx, r)
		t.shadowed(j, &d, err, j.policy.Drop && j.overCap(d.TakeIndex)) // quiet hours never drop
	}
	if j.route.Shadow {
		r := throttle.Request{ID: j.id, MaxWait: t.InlineWait, Tenant: j.n.Tenant, Weight: j.weight,
			Takes: []throttle.Take{{Rule: j.route.Bucket, Subject: "shadow:" + j.n.Provider}}}
		d, err := t.Limiter.Admit(ctx, r)
		t.shadowed(j, &d, err, false)
	}
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
	t.Log.Info("shadow: would have "+would, "task", j.id, "recipient", Redact(j.n.Recipient), "rule", rule, "for", shortDuration(d.Delay))
}
