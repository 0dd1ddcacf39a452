package throttle

import (
	"errors"
	"fmt"
	"time"
)

// Outcome is what an admission decided for a task.
type Outcome uint8

const (
	// Denied: the task may not go. Delay is until every take would pass,
	// as far as the script can know; never shorter than needed. Nothing
	// was consumed.
	Denied Outcome = iota
	// Admitted: every take consumed; the task goes at At (Delay 0: now;
	// longer: a bucket token reserved ahead, within Request.MaxWait).
	Admitted
	// Repeated: every take already held the task's ID (a redelivered
	// task): admitted again without consuming anything.
	Repeated
	// Booked: a booking task (Limiter.Book) that may not go within its
	// MaxWait holds the moment At under its ID, and comes back then.
	Booked
	// Rebooked is Booked for a task that lost the moment it had booked (it
	// came back too late, or its slot went to priority traffic).
	Rebooked
	// Placed: a booking task whose moment is past its Booking.Horizon has a
	// place in its tenant's line at At, which holds nothing.
	Placed
	// Expired: a booking task whose moment (At) would be after its
	// Booking.Deadline: nothing is held.
	Expired
	// Done: the task's done marker (Request.CheckDone) exists: nothing was
	// checked or consumed. TakeIndex is -1, and Now the Redis time on a
	// single node (zero on a cluster).
	Done
)

var outcomeNames = [...]string{"denied", "admitted", "repeated", "booked", "rebooked", "placed", "expired", "done"}

// String returns the outcome's name: "denied", "admitted", ...
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Decision is the outcome of one admission, with what set it.
type Decision struct {
	// Outcome is what was decided.
	Outcome Outcome
	// Delay is how long the caller must wait: until the moment it may go
	// (Admitted, Repeated), until its booked moment or place (Booked,
	// Rebooked, Placed), or until every take would pass (Denied, Expired).
	Delay time.Duration
	// Now is the Redis time the decision was made at.
	Now time.Time
	// TakeIndex is the index in Request.Takes of the take that set Delay,
	// or -1.
	TakeIndex int
	// Rule and Subject are that take's rule and subject (nil and "" when
	// TakeIndex is -1).
	Rule    Rule
	Subject string
	// Limit describes the binding limit, e.g. "3 per 168h" ("" when
	// TakeIndex is -1).
	Limit string
	// Remaining is the least capacity any take has left after this decision.
	Remaining int
	// Ahead is, for a booking or a place, how many bookings on the binding
	// rule come before it (in line: about how many sends of the bucket).
	Ahead int
	// Claimed is, for an admitted request that claimed a booking, the
	// moment it had booked (its lateness is At() - Claimed when At is
	// later); zero otherwise.
	Claimed time.Time
	// Shadow is the index in Request.Takes of the take in shadow mode
	// (Take.Shadow) that would have held the task back longest, had it not
	// been in shadow mode, for ShadowDelay; -1 when none would have.
	Shadow      int
	ShadowDelay time.Duration
	// Held is set, for an allowed decision of Admit or Book, when some
	// takes already held the task's ID, at the moment an earlier admission
	// gave, which may be long past (a task run again, a booking claimed).
	// Repeated is the case where every take did.
	Held bool
}

// Allowed reports whether the task may go (at At): Admitted or Repeated.
func (d Decision) Allowed() bool { return d.Outcome == Admitted || d.Outcome == Repeated }

// Booked reports whether the task has a moment to come back at: Booked,
// Rebooked or Placed.
func (d Decision) Booked() bool {
	return d.Outcome == Booked || d.Outcome == Rebooked || d.Outcome == Placed
}

// At returns the Redis time at which the caller may go (allowed) or retry (denied).
func (d Decision) At() time.Time { return d.Now.Add(d.Delay) }

// Err returns nil for an allowed decision, ErrDone for a done one and a
// *ThrottledError otherwise.
func (d Decision) Err() error {
	switch d.Outcome {
	case Admitted, Repeated:
		return nil
	case Done:
		return ErrDone
	}
	return &ThrottledError{Decision: d}
}

// Reserved reports whether this decision left something reserved under the
// task's ID: it was admitted, or booked a slot. A caller that will not deliver
// it releases that (Limiter.Release).
func (d Decision) Reserved() bool {
	switch d.Outcome {
	case Admitted, Repeated, Booked, Rebooked:
		return true
	}
	return false
}

// ErrDone is Decision.Err of a task whose done marker exists.
var ErrDone = errors.New("throttle: task is done")

// ThrottledError is a denied admission. It carries the decision, so a caller
// that only passes errors along (a job handler) can still defer by its Delay.
type ThrottledError struct {
	Decision Decision
}

// Error returns e.g. `throttle: quota marketing (3 per 168h) for "alice" denies; retry in 17h2m0s`.
func (e *ThrottledError) Error() string {
	d := e.Decision
	verb := "denies; retry in"
	switch d.Outcome {
	case Placed:
		verb = "is booked beyond its horizon; place in line in"
	case Booked, Rebooked:
		verb = "is booked; moment in"
	case Expired:
		verb = "leaves no moment before the deadline; earliest in"
	}
	if d.TakeIndex < 0 {
		return fmt.Sprintf("throttle: denied; retry in %s", d.Delay)
	}
	return fmt.Sprintf("throttle: %s %s (%s) for %q %s %s",
		kindName(d.Rule), d.Rule.Name(), d.Limit, d.Subject, verb, roundDelay(d.Delay))
}

// kindName returns the rule's kind for people.
func kindName(r Rule) string {
	return map[string]string{"q": "quota", "b": "bucket", "c": "calendar", "h": "quiet hours"}[r.kind()]
}

// roundDelay shortens a delay for people: whole seconds above a minute.
func roundDelay(d time.Duration) time.Duration {
	if d > time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
