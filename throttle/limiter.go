package throttle

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/coalesce"
	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/lua"
)

// DefaultPrefix starts every key unless Options.Prefix says otherwise.
const DefaultPrefix = keyspace.DefaultPrefix

// DefaultRemember is how long a bucket's ledger keeps a take after its slot
// ended unless Options.Remember says otherwise. A task holds its slot until
// the slot ends whatever this is: what is kept longer serves only to inspect
// what went when.
const DefaultRemember = 2 * time.Second

// MinRemember is the shortest Options.Remember New accepts (and the config's
// worker.remember_takes).
const MinRemember = time.Second

// Options configure a Limiter. The zero value means every default.
type Options struct {
	// Prefix starts every key. Default DefaultPrefix. No '{' or '}'.
	Prefix string
	// Remember is how long a bucket's ledger keeps a take after its slot
	// ended (docs/design.md, Algorithms). Default DefaultRemember.
	Remember time.Duration
}

// Limiter admits tasks through rules whose state lives in Redis. All
// decisions use Redis time, so any number of Limiters on any number of hosts
// share one truth. A Limiter is safe for concurrent use.
type Limiter struct {
	rdb      redis.UniversalClient
	one      coalesce.Processor // single commands: rdb's auto-pipeliner on one node
	prefix   string
	remember string // µs, as plans carry it
	eng      engine // node or sharded, chosen in New
	lib      lua.Library
	admit    entry
	book     entry
	release  entry
	pause    entry
	repace   entry
	reweigh  entry
	forget   entry

	// noFunctions is set once the server has shown that it has no Redis
	// Functions (FCALL unknown or not permitted): from then on the entry
	// points run as scripts (EVALSHA).
	noFunctions atomic.Bool
	loading     sync.Mutex // one FUNCTION LOAD at a time
	sent        sends      // Sent's counts, until CountSends writes them
}

// New returns a Limiter on rdb (a *redis.Client, *redis.ClusterClient or
// failover client).
func New(rdb redis.UniversalClient, opts Options) (*Limiter, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if err := keyspace.CheckPrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("throttle: %w", err)
	}
	if opts.Remember == 0 {
		opts.Remember = DefaultRemember
	}
	if opts.Remember < MinRemember {
		return nil, fmt.Errorf("throttle: remember must be at least %s (got %s)", MinRemember, opts.Remember)
	}
	lib := lua.Functions()
	l := &Limiter{
		rdb:      rdb,
		one:      coalesce.Of(rdb),
		prefix:   opts.Prefix,
		remember: fmt.Sprint(opts.Remember.Microseconds()),
		lib:      lib,
		admit:    newEntry(lib.Admit, lua.Admit()),
		book:     newEntry(lib.Book, lua.Book()),
		release:  newEntry(lib.Release, lua.Release()),
		pause:    newEntry(lib.Pause, lua.Pause()),
		repace:   newEntry(lib.Repace, lua.Repace()),
		reweigh:  newEntry(lib.Reweigh, lua.Reweigh()),
		forget:   newEntry(lib.Forget, lua.Forget()),
	}
	l.eng = node{l}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		l.eng = sharded{l}
	}
	return l, nil
}

// Admit checks every take of r and, only if all pass, consumes them together.
// A denied decision is not an error; Decision.Err turns it into one.
func (l *Limiter) Admit(ctx context.Context, r Request) (Decision, error) {
	if err := r.validate(); err != nil {
		return Decision{}, err
	}
	return l.eng.decide(ctx, r)
}

// Book reserves the moment of a task that may not go within r.MaxWait, as
// x/time/rate's Reserve does: the earliest moment every take allows,
// counting every moment booked before on the same subjects, held under r.ID
// until the task comes back with the same request to claim it (Booked,
// Rebooked, Placed or Expired). A task that may go within r.MaxWait is
// admitted as by Admit. A request that books has at most one bucket. The
// model: docs/booking.md.
func (l *Limiter) Book(ctx context.Context, r Request, b Booking) (Decision, error) {
	r.book = &b
	return l.Admit(ctx, r)
}

// Check decides r as Admit would (r.CheckDone is ignored), and writes
// nothing: what a rule in shadow mode would have done. Takes r.ID holds
// pass, as in Admit.
func (l *Limiter) Check(ctx context.Context, r Request) (Decision, error) {
	r.book, r.CheckDone, r.check = nil, false, true
	return l.Admit(ctx, r)
}

// HasSlot reports whether r's buckets still give r.ID the slots it was
// admitted to: a task that sleeps until its moment may lose its slot to a
// priority request, a re-pace or a pause (docs/booking.md, Priority), and
// then releases what it still holds and is admitted again.
func (l *Limiter) HasSlot(ctx context.Context, r Request) (bool, error) {
	for _, t := range r.Takes {
		b, ok := t.Rule.(*Bucket)
		if !ok {
			continue
		}
		err := l.rdb.ZScore(ctx, keyspace.Slots(keyspace.Tag(l.prefix, t.Subject), b.name), keyspace.LedgerEntry(r.ID)).Err()
		if err == redis.Nil {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("throttle: holds %q: %w", r.ID, err)
		}
	}
	return true, nil
}

// Release gives back what r.ID's admission took from r's takes (quota and
// calendar entries, bucket slots reserved or used), for a task admitted but
// not delivered: call it with the takes and costs it was admitted with.
// Releasing twice, or a task never admitted, does nothing. It returns how
// many takes it gave back.
func (l *Limiter) Release(ctx context.Context, r Request) (int, error) {
	n, _, err := l.undo(ctx, r, l.release, "release")
	return n, err
}

// Forget drops r.ID's holdings of r's bucket takes without giving their
// tokens back, for a send the provider took but failed (a 429 or 5xx), so
// that its retry takes a token of its own; quota and calendar takes stay.
// It returns how many bucket takes it dropped.
func (l *Limiter) Forget(ctx context.Context, r Request) (int, error) {
	n, _, err := l.undo(ctx, r, l.forget, "forget")
	return n, err
}

// undo runs release.lua's entry point e (release or forget) on r's takes,
// and returns how many it undid and the Redis time of its first group.
func (l *Limiter) undo(ctx context.Context, r Request, e entry, what string) (int, time.Time, error) {
	if err := r.validate(); err != nil {
		return 0, time.Time{}, err
	}
	res, err := l.eval(ctx, e, l.undoCalls(r, l.eng.groups(ctx, r, false)))
	if nonLocal(err) {
		res, err = l.eval(ctx, e, l.undoCalls(r, l.eng.groups(ctx, r, true)))
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("throttle: %s %q: %w", what, r.ID, err)
	}
	n, now := 0, time.Time{}
	for i, a := range res {
		if len(a) != 2 {
			return 0, time.Time{}, fmt.Errorf("throttle: unexpected script reply %v", a)
		}
		if i == 0 {
			now = time.UnixMicro(a[0])
		}
		n += int(a[1])
	}
	return n, now, nil
}

// Pause drains bucket b's tokens for subject so that its next token is
// due in d, for every Limiter on this Redis: the way to honour a provider's
// Retry-After across a fleet. Reservations already made are kept, and the
// line waiting moves past the pause (docs/booking.md, "A provider's pause").
// It returns the time until the bucket's next token.
func (l *Limiter) Pause(ctx context.Context, b *Bucket, subject string, d time.Duration) (time.Duration, error) {
	r := Request{ID: "pause", Takes: []Take{{Rule: b, Subject: subject}}, MaxWait: d}
	if err := r.validate(); err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("throttle: pause %s for %q: must be positive (got %s): %w", b.Name(), subject, d, ErrInvalidRequest)
	}
	res, err := l.onBucket(ctx, l.pause, r, 1, func(plan string) []any { return []any{d.Microseconds(), plan} })
	if err != nil {
		return 0, err
	}
	return time.Duration(res[0]) * time.Microsecond, nil
}

// Repace moves the work waiting on bucket b for subject to b's rate, when
// the rate its slots were laid at differs (docs/booking.md, "A change of
// rate"). It returns k = old rate / new rate and the Redis time it scaled
// around (k = 0: nothing was scaled); a moment t the caller keeps moves to
// now + (t - now)·k. Call it for each bucket at start and after a reload.
func (l *Limiter) Repace(ctx context.Context, b *Bucket, subject string) (k float64, now time.Time, err error) {
	r := Request{ID: "repace", Takes: []Take{{Rule: b, Subject: subject}}}
	if err := r.validate(); err != nil {
		return 0, time.Time{}, err
	}
	res, err := l.onBucket(ctx, l.repace, r, 2, func(plan string) []any { return []any{plan} })
	if err != nil {
		return 0, time.Time{}, err
	}
	return float64(res[1]) / 1e6, time.UnixMicro(res[0]), nil
}

// Reweigh moves the lines of the tenants waiting on bucket b for subject to
// changed weights (docs/booking.md, "A change of weight"); a tenant not in
// weights weighs 1. It returns each named tenant's factor (1 for one not
// waiting) and Redis's now, or no factors when no waiting tenant's weight
// changed (only the first of a fleet's workers to call it scales). The
// caller moves the wake-ups of the tasks in line by their tenant's factor.
func (l *Limiter) Reweigh(ctx context.Context, b *Bucket, subject string, weights map[string]int) (map[string]float64, time.Time, error) {
	return l.reweighCall(ctx, "apply", b, subject, weights)
}

// Reweighed reports whether a tenant waiting on bucket b for subject holds
// a weight other than weights gives it, writing nothing: whether Reweigh
// would scale, so that a start or a reload that changed no weight need not
// read the waiting work.
func (l *Limiter) Reweighed(ctx context.Context, b *Bucket, subject string, weights map[string]int) (bool, error) {
	k, _, err := l.reweighCall(ctx, "check", b, subject, weights)
	return k != nil, err
}

// reweighCall is Reweigh (mode "apply") or Reweighed ("check").
func (l *Limiter) reweighCall(ctx context.Context, mode string, b *Bucket, subject string, weights map[string]int) (map[string]float64, time.Time, error) {
	r := Request{ID: "reweigh", Takes: []Take{{Rule: b, Subject: subject}}}
	if err := r.validate(); err != nil {
		return nil, time.Time{}, err
	}
	names := slices.Sorted(maps.Keys(weights))
	a, err := l.onBucket(ctx, l.reweigh, r, 0, func(string) []any {
		args := []any{mode, len(names)}
		for _, t := range names {
			args = append(args, t, max(1, weights[t]))
		}
		return args
	})
	switch {
	case err != nil:
		return nil, time.Time{}, err
	case len(a) == 2 && a[1] == 0:
		return nil, time.UnixMicro(a[0]), nil
	case len(a) == 2 && a[1] == 1 && mode == "check":
		return map[string]float64{}, time.UnixMicro(a[0]), nil
	case len(a) != 2+len(names) || a[1] != 1:
		return nil, time.Time{}, fmt.Errorf("throttle: reweigh %s for %q: unexpected script reply %v", b.Name(), subject, a)
	}
	k := make(map[string]float64, len(names))
	for i, t := range names {
		k[t] = float64(a[2+i]) / 1e6
	}
	return k, time.UnixMicro(a[0]), nil
}

// onBucket runs entry point e on the keys of r's one take, a bucket, with
// the arguments args makes of the take's plan, and returns its reply, of
// want integers unless want is 0.
func (l *Limiter) onBucket(ctx context.Context, e entry, r Request, want int, args func(plan string) []any) ([]int64, error) {
	keys, plan := l.appendPlan(nil, nil, r, group{takes: []int{0}}, planHead{})
	c := append(call{"fcall", nil, len(keys)}, keys...)
	res, err := l.eval(ctx, e, []call{append(c, args(string(plan))...)})
	if err == nil && want > 0 && len(res[0]) != want {
		err = fmt.Errorf("unexpected script reply %v", res[0])
	}
	if err != nil {
		t := r.Takes[0]
		return nil, fmt.Errorf("throttle: %s %s for %q: %w", r.ID, t.Rule.Name(), t.Subject, err)
	}
	return res[0], nil
}
