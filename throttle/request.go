package throttle

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrInvalidRequest is wrapped by every error that rejects a request before
// it reaches Redis.
var ErrInvalidRequest = errors.New("invalid request")

// Bounds on a request.
const (
	MaxIDLen  = 256  // the longest task ID a request may carry, in bytes
	MaxWeight = 1000 // the largest tenant weight
	MaxTakes  = 32   // the most takes a request may have
)

// Take applies a rule to one subject at a cost.
type Take struct {
	// Rule is the limit to check.
	Rule Rule
	// Subject is what the rule is counted for (a recipient, a provider):
	// any non-empty string, encoded before it becomes part of a Redis key.
	Subject string
	// Cost is what the take consumes: tokens of a bucket, entries of a quota
	// or a calendar window. Zero means 1.
	Cost int
	// CountOnly records the take like any other but never lets it deny the
	// request or set its wait or booked moment (docs/rules.md, Count-only
	// traffic). Only for a *Quota or a *CalendarWindow.
	CountOnly bool
	// Shadow puts the take's rule in shadow mode: it counts only, and
	// Decision.Shadow says whether it would have held the task back,
	// decided atomically with the writing of its entries (docs/rules.md,
	// Shadow mode). Only for a *Quota, a *CalendarWindow or *Quiet hours.
	Shadow bool
}

func (t Take) cost() int { return cmp.Or(t.Cost, 1) }

// Request asks to admit one task through all of its takes at once.
type Request struct {
	// ID identifies the task. Admission is idempotent by ID: a take that
	// already holds it passes without consuming again.
	ID string
	// Takes are the rules the task must pass, all or none.
	Takes []Take
	// MaxWait lets a bucket that is short of tokens reserve them ahead when
	// the wait is at most MaxWait and no other take denies; the decision is
	// then allowed with Delay set to the wait. Zero never reserves.
	MaxWait time.Duration
	// CheckDone asks the admission to look for the task's done marker
	// (Limiter.MarkDone) first: a marked task's admission checks and
	// consumes nothing, and its outcome is Done. Release, Forget and Pause
	// ignore it. How it is read: docs/design.md, "Redis Cluster".
	CheckDone bool
	// DoneIfHeld, with CheckDone, looks for the marker only where the
	// request's first take, a quota, finds the task holding its entry: the
	// caller says a marked task holds one (the quota's longest window
	// outlasts the marker), so a new task's admission makes no look. On one
	// node only.
	DoneIfHeld bool

	book  *Booking // set by Limiter.Book: the request books
	check bool     // decide only, write nothing (Limiter.Check)
}

// Booking is what a request that reserves its moment (Limiter.Book) says
// beyond its takes: docs/booking.md. The zero value books with no horizon,
// share or deadline.
type Booking struct {
	// Priority lets the task take a bucket's reserve (Bucket.WithReserve)
	// and the slot of the first booking or sleeping claim ahead of it
	// (docs/booking.md, Priority).
	Priority bool
	// Tenant is the sender whose share of a bucket the task uses: tenants
	// waiting on one bucket book at Weight over the weights of those
	// waiting (docs/booking.md, Fair shares). Empty is the default tenant.
	Tenant string
	// Weight is the tenant's weight, at least 1 (zero means 1).
	Weight int
	// Horizon is how far ahead the task may hold a bucket's slot (zero: as
	// far as it needs); further, it gets a place in its tenant's line
	// (Placed), which holds nothing.
	Horizon time.Duration
	// Back says the task is back from a place in its tenant's line, or lost
	// a slot it held (HasSlot): it takes the first free slot from now
	// rather than join its line's end. The engine keeps no record of a
	// place: the caller keeps this bit with the task (docs/booking.md,
	// Places in line).
	Back bool
	// Backlog says work the caller has not picked up yet waits behind this
	// task: with a horizon, it books rather than sleep for its moment, so
	// that the tenants further back are seen at once (docs/booking.md, Work
	// the workers have not seen yet). A task Back is not affected.
	Backlog bool
	// Deadline, if set, is the latest moment (Redis time) a booking may be
	// for: a task whose moment would be later is not booked and its
	// decision is Expired, with At the moment it would have had.
	Deadline time.Time
}

// validate rejects what no Redis call could make right: bad IDs, empty keys,
// costs no rule could ever admit, a rule taken twice for one subject.
func (r Request) validate() error {
	if err := checkID(r.ID); err != nil {
		return err
	}
	if len(r.Takes) == 0 {
		return fmt.Errorf("throttle: task %q: no takes: %w", r.ID, ErrInvalidRequest)
	}
	if len(r.Takes) > MaxTakes {
		return fmt.Errorf("throttle: task %q: %d takes: at most %d: %w", r.ID, len(r.Takes), MaxTakes, ErrInvalidRequest)
	}
	if r.MaxWait < 0 {
		return fmt.Errorf("throttle: task %q: max wait must not be negative (got %s): %w", r.ID, r.MaxWait, ErrInvalidRequest)
	}
	if b := r.book; b != nil {
		if b.Weight < 0 || b.Weight > MaxWeight {
			return fmt.Errorf("throttle: task %q: weight %d: must be 1 to %d: %w", r.ID, b.Weight, MaxWeight, ErrInvalidRequest)
		}
		if len(b.Tenant) > MaxIDLen || !utf8.ValidString(b.Tenant) || strings.ContainsFunc(b.Tenant, unicode.IsControl) {
			return fmt.Errorf("throttle: task %q: tenant %q: at most %d bytes of UTF-8 without control characters: %w", r.ID, b.Tenant, MaxIDLen, ErrInvalidRequest)
		}
		if b.Horizon < 0 {
			return fmt.Errorf("throttle: task %q: horizon must not be negative (got %s): %w", r.ID, b.Horizon, ErrInvalidRequest)
		}
	}
	buckets := 0
	for i, t := range r.Takes {
		// Formatted only on error: validation runs on every admission.
		where := func() string { return fmt.Sprintf("throttle: task %q: take %d", r.ID, i+1) }
		switch {
		case t.Rule == nil:
			return fmt.Errorf("%s: no rule: %w", where(), ErrInvalidRequest)
		case t.Subject == "":
			return fmt.Errorf("%s (%s): empty key: %w", where(), t.Rule.Name(), ErrInvalidRequest)
		case t.Cost < 0:
			return fmt.Errorf("%s (%s): cost must be at least 1 (got %d): %w", where(), t.Rule.Name(), t.Cost, ErrInvalidRequest)
		case t.cost() > t.Rule.MaxCost():
			return fmt.Errorf("%s: cost %d exceeds what %s %s (%s) can ever admit (%d): %w",
				where(), t.cost(), kindName(t.Rule), t.Rule.Name(), t.Rule, t.Rule.MaxCost(), ErrInvalidRule)
		}
		if t.CountOnly && t.Rule.kind() != "q" && t.Rule.kind() != "c" {
			return fmt.Errorf("%s (%s): only a quota or a calendar window counts only: %w", where(), t.Rule.Name(), ErrInvalidRequest)
		}
		if t.Shadow && t.Rule.kind() != "q" && t.Rule.kind() != "c" && t.Rule.kind() != "h" {
			return fmt.Errorf("%s (%s): only a quota, a calendar window or quiet hours are in shadow mode: %w", where(), t.Rule.Name(), ErrInvalidRequest)
		}
		if _, ok := t.Rule.(*Bucket); ok {
			buckets++
			if r.book != nil && buckets > 1 {
				return fmt.Errorf("%s (%s): a request that books has at most one bucket: %w", where(), t.Rule.Name(), ErrInvalidRequest)
			}
		}
		for _, u := range r.Takes[:i] {
			if u.Subject == t.Subject && u.Rule.kind() == t.Rule.kind() && u.Rule.Name() == t.Rule.Name() {
				return fmt.Errorf("%s: %s for %q is taken twice: %w", where(), t.Rule.Name(), t.Subject, ErrInvalidRequest)
			}
		}
	}
	return nil
}

// checkID accepts 1 to MaxIDLen bytes of UTF-8 without control characters.
func checkID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("throttle: empty task ID: %w", ErrInvalidRequest)
	case len(id) > MaxIDLen:
		return fmt.Errorf("throttle: task ID of %d bytes: longer than %d: %w", len(id), MaxIDLen, ErrInvalidRequest)
	case !utf8.ValidString(id):
		return fmt.Errorf("throttle: task ID %q: not UTF-8: %w", id, ErrInvalidRequest)
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("throttle: task ID %q: control character %U: %w", id, c, ErrInvalidRequest)
		}
	}
	return nil
}
