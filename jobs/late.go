package jobs

// A send that would leave late takes the next moment instead.

import (
	"context"
	"fmt"
	"time"
)

// onTime runs just before j's send. A send that would leave more than
// LateAfter after the moment j was admitted for (its worker was slow to
// get to it: a busy machine, a stalled process, slow checks before the
// send) would reach the provider out of step with the rules: closer to its
// recipient's next message than the windows allow, since that one was, or
// will be, admitted against the earlier moment, and bunched with the sends
// of the provider's later slots. So j gives back what it holds and is
// admitted again, from now: it takes the next moment every rule allows,
// after the messages admitted meanwhile. A send on time costs nothing.
func (t *Throttle) onTime(ctx context.Context, j *job) error {
	if t.LateAfter <= 0 || j.due.IsZero() || time.Since(j.due) <= t.LateAfter {
		return nil
	}
	t.Metrics.LateSends.Inc()
	t.Log.Info("about to send late: admitting it again", "task", j.id, "late", time.Since(j.due).Round(time.Millisecond))
	return t.again(ctx, j)
}

// again gives back what j holds and admits it again, from now (readmit);
// j is deferred instead once it has been admitted again maxBumps times.
func (t *Throttle) again(ctx context.Context, j *job) error {
	t.release(j.request())
	if j.bumps++; j.bumps > maxBumps {
		return &Deferral{Delay: time.Second, Reason: fmt.Sprintf("it was about to go late, held an earlier run's moment, or lost its slot (to priority traffic, a change of rate, or a check that did not answer in time), %d times", maxBumps)}
	}
	j.due = time.Time{}
	return t.readmit(ctx, j)
}
