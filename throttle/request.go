package throttle

import (
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

// MaxIDLen is the longest task ID a request may carry, in bytes.
const MaxIDLen = 256

// MaxWeight is the largest tenant weight.
const MaxWeight = 1000

// MaxTakes is the most takes a request may have.
const MaxTakes = 32

// Take applies a rule to one subject at a cost.
type Take struct {
	// Rule is the limit to check.
	Rule Rule
	// Subject is what the rule is counted for: a recipient, a provider.
	// Any non-empty string; it is encoded before it becomes part of a Redis
	// key.
	Subject string
	// Cost is what the take consumes: tokens of a bucket, entries of a quota
	// or a calendar window. Zero means 1.
	Cost int
	// CountOnly records the take like any other (its entries count toward
	// the rule, and Release gives them back) but never lets it deny the
	// request or set its wait or booked moment: traffic that counts toward
	// a cap without being held by it. Only for a *Quota or a
	// *CalendarWindow.
	CountOnly bool
	// Shadow puts the take's rule in shadow mode: it counts only (as
	// CountOnly; quiet hours hold nothing either way), and the decision
	// says whether it would have held the task back, and how long
	// (Decision.Shadow), decided in the same atomic step as its entries
	// are written, so that tasks racing on one subject each see the ones
	// before. Only for a *Quota, a *CalendarWindow or *Quiet hours.
	Shadow bool
}

func (t Take) cost() int {
	if t.Cost == 0 {
		return 1
	}
	return t.Cost
}

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
	// first (Limiter.MarkDone: the caller marks a task that needs no
	// admission any more, a sent notification): if the task is marked, the
	// admission checks and consumes nothing and its outcome is Done. On a
	// single node the look is part of the admission's script call; on a
	// cluster, where the marker lives in the task's own slot, it is read
	// beside the admission's first call, at no round trip of its own.
	// Release, Forget and Pause ignore it.
	CheckDone bool
	// DoneIfHeld, with CheckDone, looks for the marker only where the
	// request's first take, a quota, finds the task holding its entry:
	// the caller says that a marked task holds one, because the quota's
	// longest window outlasts the marker (a quota entry is written by the
	// admission that let the task go, and a send follows it). The most
	// common admission, a new task's, then makes no look. On one node only.
	DoneIfHeld bool

	book  *Booking // set by Limiter.Book: the request books
	check bool     // decide only, write nothing (Limiter.Check)
}

// Booking is what a request that reserves its moment (Limiter.Book) says
// beyond its takes. The zero value books with no horizon, share or
// deadline.
type Booking struct {
	// Priority lets the task take a bucket's reserve (see
	// Bucket.WithReserve) and go before the bookings in line on it: it
	// takes the slot of the first booking not yet claimed, or of a task
	// that claimed its slot and sleeps until it (that task finds out by
	// HasSlot before it sends).
	Priority bool
	// Tenant is the fairness key: the sender whose share of a bucket the
	// task uses (a team, a campaign). When several tenants wait on one
	// bucket, each books at its share of the bucket's rate (Weight over the
	// weights of the tenants waiting); a tenant alone uses the whole rate.
	// Empty is a tenant of its own (the default one).
	Tenant string
	// Weight is the tenant's weight, at least 1 (zero means 1).
	Weight int
	// Horizon is how far ahead the task may hold a bucket's slot; zero: as
	// far as it needs. A task whose slot would be further gets a place in
	// its tenant's line instead (outcome Placed), which holds nothing, and
	// books when it comes back, inside the horizon by then.
	Horizon time.Duration
	// Back says the task is back from a place in its tenant's line: it was
	// Placed, and comes back at its place (or it held a slot that was taken
	// from it: see HasSlot). The engine keeps no record of a
	// place (a line of any length costs it nothing per task); the caller
	// keeps this one bit of it with the task (the worker in the task's own
	// message: docs/booking.md). A task back from its place takes the first
	// free slot from now; one not back, of a tenant whose line reaches past
	// the horizon, joins the line's end.
	Back bool
	// Backlog says that work the caller has not picked up yet waits behind
	// this task (its queue is not empty). A task with a horizon then never
	// goes to sleep for its moment within MaxWait: it books it (a slot
	// within the horizon, a place in its tenant's line past it) and the
	// caller moves on to the work behind it, so that a tenant whose work is
	// further back in the queue is seen, and gets its share, at once. A
	// task back from its place is not affected: it waited its turn.
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
