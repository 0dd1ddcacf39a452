package jobs

import (
	"errors"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// Each task's outcome is one log line with its task ID, written here: at
// INFO for what the rules chose (sent, booked, deferred, dropped, expired,
// folded), at WARN for what went wrong (archived: malformed, rejected by
// the provider). The recipient is redacted (message.Redact); moments are
// Redis's, in UTC. The error a logged outcome returns is marked (Logged),
// so that the worker's asynq error handler does not log it again. Each
// outcome is also the message's event (events.go): a line's msg is its
// event's type (lifecycle.Type).

// loggedError is an error whose outcome was logged (see Logged). archived
// is, for an archive, its event's reason: logArchived knows the task ID
// alone, and the run's end records the event with its tenant (ended).
type loggedError struct {
	err      error
	archived string
}

func (e *loggedError) Error() string { return e.err.Error() }
func (e *loggedError) Unwrap() error { return e.err }

// Logged reports whether err is the result of a task whose outcome the
// throttle has logged already: an asynq ErrorHandler logs nothing more
// for it.
func Logged(err error) bool {
	var l *loggedError
	return errors.As(err, &l)
}

// logged marks err as logged; nil stays nil.
func logged(err error) error {
	if err == nil || Logged(err) {
		return err
	}
	return &loggedError{err: err}
}

// who returns the attributes that say which message j is.
func (j *job) who() []any {
	a := []any{"task", j.id, "recipient", message.Redact(j.n.Recipient), "policy", j.n.Policy, "provider", j.n.Provider}
	if j.n.Tenant != "" {
		a = append(a, "tenant", j.n.Tenant)
	}
	return a
}

// utc is a moment for a log line: Redis's, in UTC, to the millisecond.
func utc(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// logSent logs a message its provider accepted, with the provider's ID for
// it (provider_id), when it gave one, and records its event.
func (t *Throttle) logSent(j *job, providerID string) {
	a := append(j.who(), "queue", j.queue)
	if providerID != "" {
		a = append(a, "provider_id", providerID)
	}
	t.Log.Info(string(lifecycle.Sent), a...)
	t.recordSent(j, providerID)
}

// recordSent records j's sent event, with its provider's ID of the message
// (providerID) when the provider gave one.
func (t *Throttle) recordSent(j *job, providerID string) {
	e := j.event(lifecycle.Sent)
	e.Provider, e.ProviderMessageID = j.n.Provider, providerID
	t.record(e)
}

// logBooked logs a job deferred to the moment it booked (or to its place
// in line, what says which) and returns err marked as logged.
func (t *Throttle) logBooked(j *job, d *throttle.Decision, rule, what string, err error) error {
	t.Log.Info(string(lifecycle.Booked), append(j.who(), "at", utc(d.At()), "rule", rule, "as", what, "ahead", d.Ahead)...)
	e := j.event(lifecycle.Booked)
	e.At, e.Moment, e.Rule = d.Now, lifecycle.Moment(d.At()), rule
	t.record(e)
	return logged(err)
}

// logDeferred logs a job deferred by a rule without booking (the reason
// first, as the worker has always worded it) and returns err marked as
// logged.
func (t *Throttle) logDeferred(j *job, d *throttle.Decision, rule string, err error) error {
	t.Log.Info(string(lifecycle.Deferred), append([]any{"task", j.id, "reason", err.Error(), "until", utc(d.At()), "rule", rule}, j.who()[2:]...)...)
	e := j.event(lifecycle.Deferred)
	e.At, e.Until, e.Rule = d.Now, lifecycle.Moment(d.At()), rule
	t.record(e)
	return logged(err)
}

// logDropped logs a job its policy's over_cap: drop dropped and returns
// err marked as logged.
func (t *Throttle) logDropped(j *job, d *throttle.Decision, rule string, err error) error {
	t.Log.Info(string(lifecycle.Dropped), append(j.who(), "rule", rule, "earliest", utc(d.At()))...)
	e := j.event(lifecycle.Dropped)
	e.At, e.Rule = d.Now, rule
	t.record(e)
	return logged(err)
}

// logExpired logs a job whose deadline (its send-by, or its policy's
// max_delay) comes before the rules would let it go, and returns err
// marked as logged.
func (t *Throttle) logExpired(j *job, d *throttle.Decision, deadline string, err error) error {
	t.Log.Info(string(lifecycle.Expired), append(j.who(), "deadline", deadline, "rule", t.denier(j, d), "earliest", utc(d.At()))...)
	e := j.event(lifecycle.Expired)
	e.At, e.Reason, e.Rule = d.Now, deadline, t.denier(j, d)
	t.record(e)
	return logged(err)
}

// logFolded logs a job folded into its recipient's digest, which goes at
// at.
func (t *Throttle) logFolded(j *job, digest string, at time.Time) {
	t.Log.Info(string(lifecycle.Folded), append(j.who(), "digest", digest, "at", utc(at))...)
	e := j.event(lifecycle.Folded)
	e.Digest, e.Moment = digest, lifecycle.Moment(at)
	t.record(e)
}

// logArchived logs a task archived for a fault (a malformed payload, a
// provider's rejection): a WARN, since no rule chose it. It returns err
// marked as logged, with its event's reason for the run's end to record
// (ended): a task of another type is no message, and has no event.
func (t *Throttle) logArchived(id, reason string, err error) error {
	t.Log.Warn(string(lifecycle.Archived), "task", id, "reason", reason, "err", err)
	return &loggedError{err: err, archived: archivedReasons[reason]}
}

// archivedReasons are the event reasons of logArchived's reasons.
var archivedReasons = map[string]string{"malformed": lifecycle.ArchivedMalformed, "rejected by the provider": lifecycle.ArchivedRejected}
