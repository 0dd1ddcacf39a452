package throttle

import (
	"errors"
	"fmt"
	"time"
)

// Decision is the outcome of one admission.
type Decision struct {
	// Allowed reports whether the task was admitted (every take consumed).
	Allowed bool
	// Delay is how long the caller must wait. Allowed: until the moment a
	// reserved bucket token may be used (0: go now). Denied: until every take
	// would pass, as far as the script can know; never shorter than needed.
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
	// Repeated reports whether every take already held this task ID, so this
	// admission consumed nothing (a redelivered task).
	Repeated bool
	// Done reports that the request's done marker (Request.Done) exists:
	// nothing was checked or consumed. Allowed is false, TakeIndex -1, and Now
	// is the Redis time on a single node (zero on a cluster).
	Done bool
	// Booked reports a request with Request.Book that may not go within
	// its MaxWait: it holds the moment At (Delay from Now) under its ID, and
	// comes back to claim it. Allowed is false; TakeIndex is the take that set
	// the moment.
	Booked bool
	// Rebooked, with Booked, says the task had booked before and lost that
	// moment (it came back too late, or the tokens went to priority
	// traffic): what it held was given back and it booked again.
	Rebooked bool
	// Queued, with Booked, says the moment is a place in the tenant's line
	// past the bucket's horizon (Request.BookAhead): nothing is held; the
	// task comes back at At and books then.
	Queued bool
	// Ahead is, for a booking, how many bookings on the binding rule come
	// before it (in line: about how many sends of the bucket).
	Ahead int
	// Expired reports a booking request whose moment (At) would be after its
	// Request.Deadline: nothing is held. Allowed and Booked are false.
	Expired bool
	// Claimed is, for an allowed request that claimed a booking, the moment
	// it had booked (its lateness is At() - Claimed when At is later);
	// zero otherwise.
	Claimed time.Time
}

// At returns the Redis time at which the caller may go (allowed) or retry (denied).
func (d Decision) At() time.Time { return d.Now.Add(d.Delay) }

// Err returns nil for an allowed decision, ErrDone for a done one and a
// *ThrottledError otherwise.
func (d Decision) Err() error {
	if d.Allowed {
		return nil
	}
	if d.Done {
		return ErrDone
	}
	return &ThrottledError{Decision: d}
}

// Reserved reports whether this decision left something reserved under the
// task's ID: it was admitted, or booked a slot. A caller that will not deliver
// it releases that (Limiter.Release).
func (d Decision) Reserved() bool {
	return d.Allowed || d.Booked && !d.Queued
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
	switch {
	case d.Queued:
		verb = "is booked beyond its horizon; place in line in"
	case d.Booked:
		verb = "is booked; moment in"
	case d.Expired:
		verb = "leaves no moment before the deadline; earliest in"
	}
	if d.TakeIndex < 0 {
		return fmt.Sprintf("throttle: denied; retry in %s", d.Delay)
	}
	return fmt.Sprintf("throttle: %s %s (%s) for %q %s %s",
		kindName(d.Rule), d.Rule.Name(), d.Limit, d.Subject, verb, roundDelay(d.Delay))
}

// kindName returns "quota", "bucket" or "fixed window".
func kindName(r Rule) string {
	switch r.(type) {
	case *Quota:
		return "quota"
	case *Bucket:
		return "bucket"
	case *FixedWindow:
		return "fixed window"
	case *CalendarWindow:
		return "calendar"
	case *Quiet:
		return "quiet hours"
	}
	return "rule"
}

// roundDelay shortens a delay for people: whole seconds above a minute.
func roundDelay(d time.Duration) time.Duration {
	if d > time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
