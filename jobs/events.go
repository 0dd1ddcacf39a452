package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/internal/clip"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
)

// The events of the messages the throttle decides on (package lifecycle):
// each outcome is recorded where it is logged (outcome.go), just after it
// is decided, never before a send, and a run's outcome that only its error
// tells (an archive, a provider's deferral, a last failure) when the run
// ends (ended).

// Events records what happens to each message: a *lifecycle.Recorder.
type Events interface {
	// Record writes events in one round trip, once each in their
	// message's history; see lifecycle.Recorder.Record.
	Record(ctx context.Context, events ...lifecycle.Event) error
	// Now is the time by Redis's clock.
	Now(ctx context.Context) time.Time
}

// recordWithin bounds the recording of one event: a Redis that does not
// answer in time costs the event (logged, and counted by the recorder),
// never a longer run.
const recordWithin = 2 * time.Second

// record records e, unless the throttle has no Events. It waits for Redis
// (within recordWithin), so that an event is written before its task's
// run ends: a worker killed before that runs the task again, which
// records the outcome again (with the same ID, if it is the same).
func (t *Throttle) record(e lifecycle.Event) {
	if t.Events == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordWithin)
	defer cancel()
	if err := t.Events.Record(ctx, e); err != nil {
		t.Log.Warn("event not recorded", "task", e.Message, "event", e.Type, "err", err)
	}
}

// event is an event of type ty of j's message.
func (j *job) event(ty lifecycle.Type) lifecycle.Event {
	return lifecycle.Event{Type: ty, Message: j.id, Tenant: j.n.Tenant}
}

// ended records the outcome of a task's run that its error alone tells,
// and returns err: an archive logged where its tenant was not known
// (logArchived), a message archived without a log of its own (a dead or
// suppressed address), a deferral its provider asked for, and the failure
// that uses up the task's last retry, which asynq archives. n is what the
// task is of, as far as it decoded. The other outcomes were recorded where
// they were logged; a deferral of the worker's own (Redis unreachable, a
// task handed over, a shutdown) leaves the message as it was, and is none.
func (t *Throttle) ended(ctx context.Context, id string, n message.Notification, err error) error {
	if err == nil || t.Events == nil {
		return err
	}
	e := lifecycle.Event{Type: lifecycle.Archived, Message: id, Tenant: n.Tenant, Provider: n.Provider, Detail: detail(err)}
	var l *loggedError
	var d *Deferral
	switch {
	case errors.As(err, &l) && l.archived != "":
		e.Reason = l.archived
		if e.Reason == lifecycle.ArchivedMalformed {
			e.Provider = ""
		}
	case Logged(err):
		return err
	case errors.Is(err, asynq.SkipRetry):
		e.Reason = lifecycle.ArchivedDead
		if strings.HasPrefix(err.Error(), "suppressed") { // screen's: the address was suppressed before
			e.Reason = lifecycle.ArchivedSuppressed
		}
	case errors.As(err, &d) && strings.HasPrefix(d.Reason, "provider "):
		// The provider's words: a pause (429), a Retry-After, a held scope.
		e.Type, e.Until, e.Detail = lifecycle.Deferred, lifecycle.Moment(t.Events.Now(ctx).Add(d.Delay)), d.Reason
	case IsFailure(err) && lastTry(ctx):
		e.Reason = lifecycle.ArchivedExhausted
	default:
		return err
	}
	t.record(e)
	return err
}

// lastTry reports whether a failure of the task running in ctx archives
// it: it has used up its retries.
func lastTry(ctx context.Context) bool {
	retried, _ := asynq.GetRetryCount(ctx)
	most, ok := asynq.GetMaxRetry(ctx)
	return ok && retried >= most
}

// detail is err's text for an event, without asynq's SkipRetry and cut to
// 300 bytes.
func detail(err error) string {
	return clip.Cut(strings.TrimSuffix(err.Error(), ": "+asynq.SkipRetry.Error()), 300, "…")
}

// sentBefore records again the sent event of a job an earlier run of its
// task sent: that run may have died before it recorded it. The event has
// the same ID; the provider's message ID is not known again.
func (t *Throttle) sentBefore(j *job) {
	e := j.event(lifecycle.Sent)
	e.Provider = j.n.Provider
	t.record(e)
}

// refolded records again the folded event of a job an earlier run of
// its task folded (see sentBefore): with its digest, whose moment is not
// known again.
func (t *Throttle) refolded(ctx context.Context, j *job) {
	if t.Events == nil {
		return
	}
	if d, ok, _, err := t.Digests.State(ctx, j.id, j.n); err == nil && ok {
		e := j.event(lifecycle.Folded)
		e.Digest = d.TaskID()
		t.record(e)
	}
}

// payloadOf returns what a task's payload says of its message, as far as
// it decodes: the tenant and provider of its event. A digest's payload
// (digest.Ref) names them as a notification does.
func payloadOf(task *asynq.Task) message.Notification {
	var n message.Notification
	_ = json.Unmarshal(task.Payload(), &n)
	return n
}
