package jobs

// Deciding a job: one admission of its request, and what the decision
// makes of it: send now or after a short sleep, book and defer, fold into a
// digest, drop or expire.

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// admit returns nil when j may be sent now (after sleeping for a reserved
// token if need be), errSentBefore when an earlier delivery of its task was
// sent, and otherwise the error that defers or archives it.
//
// The sent marker is checked by the admission itself (throttle.Request.CheckDone):
// a redelivery whose first delivery was sent takes nothing, since its quota
// entries would be found its own but a bucket forgets its holders after
// throttle.Options.Remember, and what the first delivery took stays taken.
// On a single node that costs no round trip of its own.
func (t *Throttle) admit(ctx context.Context, j *job) error {
	var d throttle.Decision
	if err := untilAnswered(ctx, t.Stopping, func() error { return t.decide(ctx, j, &d) }); err != nil {
		// Redis trouble is not the job's fault: defer without using a retry.
		t.Log.Warn("admission failed", "task", j.id, "err", err)
		return &Deferral{Delay: 5 * time.Second, Reason: "throttle unavailable: " + err.Error()}
	}
	return t.decided(ctx, j, &d)
}

// decide is one admission call of j, timed.
func (t *Throttle) decide(ctx context.Context, j *job, d *throttle.Decision) error {
	start := time.Now()
	j.asked = start
	r := j.request()
	r.MaxWait = t.InlineWait
	var err error
	if j.book {
		*d, err = t.Limiter.Book(ctx, r, j.booking(t.Fleet != nil && t.Fleet.Waiting()))
	} else {
		*d, err = t.Limiter.Admit(ctx, r)
	}
	t.Metrics.observe(time.Since(start).Seconds())
	return err
}

// decided acts on j's decision d: send (after a wait within InlineWait),
// defer, book, fold, drop or expire.
func (t *Throttle) decided(ctx context.Context, j *job, d *throttle.Decision) error {
	t.shadowPolicy(j, d)
	if d.Outcome == throttle.Done {
		t.Metrics.inc(t.Metrics.Duplicates, j.n.Provider)
		t.Log.Info("already sent: completing without sending again", "task", j.id, "recipient", message.Redact(j.n.Recipient))
		return errSentBefore
	}
	if end := t.ending(j, d); end != goesOn {
		// Its admission may hold a booking: what it took goes back.
		if d.Reserved() {
			t.release(j.request())
		}
		return t.end(ctx, j, d, end)
	}
	if d.Booked() {
		return t.booked(ctx, j, d)
	}
	if !d.Allowed() {
		t.Metrics.inc(t.Metrics.Deferred, t.denier(j, d))
		return t.logDeferred(j, d, t.denier(j, d), &Deferral{Delay: d.Delay, Reason: "throttled by " + t.denier(j, d)})
	}
	if d.Held && d.Outcome == throttle.Admitted && !j.book {
		// An earlier run of the task (its worker died, or the reply to its
		// admission was lost) holds some of its takes, and its provider
		// slot has ended (a fresh one was taken): its moment is past.
		// Sent now, the message would reach the provider that late, within
		// a window of its recipient's next message, which was admitted
		// against that moment. A booking's claim sees that (lua/book.lua);
		// here the task gives what it holds back and is admitted again, as
		// a late send is. A repeat whose slot still holds (Repeated) is
		// on time, or another worker's run of the same task that is about
		// to send: what it holds stays.
		t.Log.Info("held what an earlier run took: admitting it again", "task", j.id)
		return t.again(ctx, j)
	}
	t.Metrics.inc(t.Metrics.Admitted, j.n.Policy, j.n.Provider)
	j.due = j.asked.Add(max(d.Delay, 0))
	if !d.Claimed.IsZero() {
		t.Metrics.inc(t.Metrics.Bookings, "claimed")
		t.Metrics.Lateness.Observe(max(0, d.At().Sub(d.Claimed)).Seconds())
	}
	if d.Delay <= 0 {
		return nil
	}
	timer := time.NewTimer(d.Delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return t.stillHolds(ctx, j)
	case <-ctx.Done():
	case <-t.Stopping:
	}
	t.release(j.request())
	return &Deferral{Delay: d.Delay, Reason: "worker stopped before the provider token was due"}
}

// ending is how a decision ends a job without a send, if it does.
type ending int

const (
	goesOn  ending = iota // it is sent, now or later
	folds                 // its policy digests: folded into the next digest
	drops                 // its policy drops what is over its cap
	expires               // its deadline comes before the rules allow it
)

// ending returns how d ends j without a send: over its policy's cap, the
// policy's over_cap says; past its deadline, it expires.
func (t *Throttle) ending(j *job, d *throttle.Decision) ending {
	over := !d.Allowed() && j.overCap(d.TakeIndex)
	dl, _ := j.deadline()
	switch {
	case over && j.policy.Digest && t.Digests != nil && !j.tried:
		return folds
	case over && j.policy.Drop:
		return drops
	case d.Outcome == throttle.Expired || !dl.IsZero() && d.At().After(dl):
		return expires
	}
	return goesOn
}

// end ends j as d's ending says: folded, or archived as dropped or expired.
func (t *Throttle) end(ctx context.Context, j *job, d *throttle.Decision, e ending) error {
	switch e {
	case folds:
		return t.fold(ctx, *j, d.At())
	case drops:
		t.Metrics.inc(t.Metrics.Dropped, j.n.Policy)
		return t.logDropped(j, d, t.denier(j, d), fmt.Errorf("dropped: over %s: %w", t.denier(j, d), asynq.SkipRetry))
	}
	_, what := j.deadline()
	t.Metrics.inc(t.Metrics.Expired, j.n.Policy)
	return t.logExpired(j, d, what, fmt.Errorf("expired: %s passed before %s would allow it (earliest %s): %w",
		what, t.denier(j, d), d.At().UTC().Format(time.RFC3339), asynq.SkipRetry))
}

// holdsWithin bounds the check of a job's slot before it sends.
const holdsWithin = 100 * time.Millisecond

// maxBumps is how many times a job that lost its slot while it slept is
// admitted again at once before it is deferred instead.
const maxBumps = 3

// stillHolds, after a job slept until its moment, checks that its provider
// slot is still its own: a priority job may have taken it (see
// throttle.Request.Priority). If it was, what the job still holds is given
// back and it is admitted again (its recipient's windows are checked
// again at its new moment).
func (t *Throttle) stillHolds(ctx context.Context, j *job) error {
	// An answer that comes late (Redis slow or restarting) would send late,
	// after the moments of the jobs behind it: past holdsWithin, the job
	// gives its slot back and is admitted again, from now.
	hctx, cancel := context.WithTimeout(ctx, holdsWithin)
	held, err := t.Limiter.HasSlot(hctx, j.request())
	cancel()
	if err == nil && held {
		return nil
	}
	if err != nil {
		t.Log.Warn("could not check the job's slot in time before sending: admitting it again", "task", j.id, "err", err)
	} else {
		t.Metrics.inc(t.Metrics.Bookings, "bumped")
	}
	// It held a slot, ahead of its tenant's line: admitted again, it takes
	// the first free slot, as a job back from its place does, rather than
	// join the line's end (docs/booking.md, "A change of rate").
	j.inLine()
	return t.again(ctx, j)
}

// readmit admits j again within its run (see again: its slot was taken
// back, its send was about to go late, or it held an earlier run's
// moment) on the rules as they are now: it may have slept across a
// reload, and the request it was routed with would take a slot of a
// lowered rate at the old pace, with the old burst's slack. If the rules
// no longer route it (its provider left the config), it is admitted on the
// ones it had.
func (t *Throttle) readmit(ctx context.Context, j *job) error {
	if fresh, err := t.route(ctx, j.id, j.n); err == nil {
		fresh.bumps, fresh.headers = j.bumps, j.headers
		*j = fresh
	}
	return t.admit(ctx, j)
}

// deferTo defers j to a moment delay from now that it waits for exactly (a
// booking, a provider's Retry-After): the fleet wakes it then
// (Throttle.Fleet), or its lead before for a booking (early: it claims its
// moment and sleeps for it), and asynq's own wake-up, which only a fleet
// with no worker running reaches, comes the second after; with no fleet,
// asynq wakes a booking wakeEarly before its moment, anything else the
// second after it (asynq keeps whole seconds: never before it).
func (t *Throttle) deferTo(j *job, delay time.Duration, early bool, reason string) *Deferral {
	wake := delay + time.Second
	switch {
	case t.Fleet != nil:
		in := delay
		if early {
			in -= t.Fleet.Lead()
		}
		t.Fleet.Wake(j.queue, j.id, max(in, 0))
	case early:
		wake = max(delay-wakeEarly, 0)
	}
	return &Deferral{Delay: delay, Wake: wake, Exact: true, Reason: reason}
}

// wakeEarly is how much earlier than its moment a booked job asks asynq to
// wake it when no fleet does: it lands 2.5 s to 0.5 s before its moment,
// within CLAIM (lua/book.lua). Why: docs/booking.md, "Waking up".
const wakeEarly = 1500 * time.Millisecond

// booked defers a job to the moment it booked, or to its place in its
// tenant's line (which the job keeps in its task: inLine), woken then
// (deferTo).
func (t *Throttle) booked(ctx context.Context, j *job, d *throttle.Decision) error {
	rule := t.denier(j, d)
	t.Metrics.inc(t.Metrics.Deferred, rule)
	event, what := "made", "booked"
	switch d.Outcome {
	case throttle.Placed:
		event, what = "queued", "in line"
		j.inLine()
	case throttle.Rebooked:
		event = "rebooked"
	}
	t.Metrics.inc(t.Metrics.Bookings, event)
	t.Metrics.BookedAhead.WithLabelValues(rule).Set(d.Delay.Seconds())
	if t.OnBooked != nil {
		t.OnBooked(j.n, *d)
	}
	return t.logBooked(j, d, rule, what, t.deferTo(j, d.Delay, true,
		fmt.Sprintf("%s for %s by %s: %d ahead", what, clockTime(d.At(), d.Now), rule, d.Ahead)))
}

// denier names the rule that set a decision's delay, with its limit:
// "policy marketing (3 per 168h)" or "provider sms (100/s burst 20)".
func (t *Throttle) denier(j *job, d *throttle.Decision) string {
	switch d.Rule.(type) {
	case nil:
		return "throttle"
	case *throttle.Bucket:
		return fmt.Sprintf("provider %s (%s)", j.n.Provider, d.Limit)
	}
	// A window, a calendar window or quiet hours ("quiet 21:00-08:00").
	return fmt.Sprintf("policy %s (%s)", j.n.Policy, d.Limit)
}
