package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/lua"
)

// DefaultRemember is how long a bucket remembers the task IDs holding its
// tokens unless Options.Remember says otherwise: long enough for asynq to
// redeliver a crashed worker's task (about a minute) with room to spare.
const DefaultRemember = 10 * time.Minute

// Options configure a Limiter. The zero value means every default.
type Options struct {
	// Prefix starts every key. Default DefaultPrefix. No '{' or '}'.
	Prefix string
	// Remember is how long a bucket remembers which task IDs took its
	// tokens, for idempotent retakes and exact refunds. Each remembered ID
	// costs about 60 bytes of Redis memory. Default DefaultRemember.
	Remember time.Duration
}

// Limiter admits tasks through rules whose state lives in Redis. All
// decisions use Redis time, so any number of Limiters on any number of hosts
// share one truth. A Limiter is safe for concurrent use.
//
// On a single node (or a Sentinel-managed one) every take of a request is
// checked and consumed by one script call. On a Redis Cluster the takes are
// grouped by subject, since each subject's keys live in their own slot: the
// groups are admitted one after another, subjects with only quotas and
// counters first and buckets last, and if one denies, the groups already
// admitted are released again. That never admits more than every rule allows
// and leaves nothing behind for a denied task; meanwhile the briefly held
// entries may deny a competing task of the same subject a little early.
type Limiter struct {
	rdb      redis.UniversalClient
	prefix   string
	remember string // µs, as the scripts take it
	cluster  bool
	admit    *redis.Script
	release  *redis.Script
	pause    *redis.Script
}

// New returns a Limiter on rdb (a *redis.Client, *redis.ClusterClient or
// failover client).
func New(rdb redis.UniversalClient, opts Options) (*Limiter, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if err := checkPrefix(opts.Prefix); err != nil {
		return nil, err
	}
	if opts.Remember == 0 {
		opts.Remember = DefaultRemember
	}
	if opts.Remember < time.Second {
		return nil, fmt.Errorf("throttle: remember must be at least 1s (got %s)", opts.Remember)
	}
	_, cluster := rdb.(*redis.ClusterClient)
	return &Limiter{
		rdb:      rdb,
		prefix:   opts.Prefix,
		remember: fmt.Sprint(opts.Remember.Microseconds()),
		cluster:  cluster,
		admit:    redis.NewScript(lua.Admit()),
		release:  redis.NewScript(lua.Release()),
		pause:    redis.NewScript(lua.Pause()),
	}, nil
}

// Admit checks every take of r and, only if all pass, consumes them together.
// A denied decision is not an error; Decision.Err turns it into one.
func (l *Limiter) Admit(ctx context.Context, r Request) (Decision, error) {
	ds, err := l.AdmitBatch(ctx, []Request{r})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

// Reserve is Admit with r.MaxWait set to maxWait: a bucket short of tokens
// for at most maxWait is reserved ahead, and the decision's Delay says how
// long to wait before using it. Release cancels a reservation.
func (l *Limiter) Reserve(ctx context.Context, r Request, maxWait time.Duration) (Decision, error) {
	r.MaxWait = maxWait
	return l.Admit(ctx, r)
}

// Release gives back what r.ID's admission took from r's takes: quota entries
// and counts are removed and bucket tokens (reserved or used) are returned.
// Call it for a task that was admitted but not delivered. Releasing twice, or
// releasing a task never admitted, does nothing. It returns how many takes it
// gave back.
func (l *Limiter) Release(ctx context.Context, r Request) (int, error) {
	n, _, err := l.release1(ctx, r)
	return n, err
}

// release1 is Release that also returns the Redis time of its first group.
func (l *Limiter) release1(ctx context.Context, r Request) (int, time.Time, error) {
	if err := r.validate(); err != nil {
		return 0, time.Time{}, err
	}
	var calls []call
	for _, g := range l.plan(r) {
		calls = append(calls, l.call(r, g))
	}
	res, err := l.eval(ctx, l.release, calls)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("throttle: release %q: %w", r.ID, err)
	}
	n, now := 0, time.Time{}
	for i, v := range res {
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return 0, time.Time{}, fmt.Errorf("throttle: unexpected script reply %v", v)
		}
		k, _ := a[0].(int64)
		n += int(k)
		if i == 0 {
			us, _ := a[1].(int64)
			now = time.UnixMicro(us)
		}
	}
	return n, now, nil
}

// AdmitBatch admits many requests in as few round trips as it can: one on a
// single node (plus one per extra subject group on a cluster). Decisions are
// in the order of rs. If it returns an error, no decision is known: requests
// that were admitted completely stay admitted (admitting them again is safe,
// since admission is idempotent by ID) and partial admissions are released.
func (l *Limiter) AdmitBatch(ctx context.Context, rs []Request) ([]Decision, error) {
	plans := make([][]group, len(rs))
	for i, r := range rs {
		if err := r.validate(); err != nil {
			return nil, err
		}
		plans[i] = l.plan(r)
	}
	ds := make([]Decision, len(rs))
	admitted := make([]int, len(rs))     // groups of rs[i] admitted so far
	consumed := make([][]group, len(rs)) // what this call consumed in them
	undo := func(match func(int) bool) {
		l.compensate(ctx, rs, consumed, match)
	}
	for phase := 0; ; phase++ {
		var calls []call
		var who []int
		for i, r := range rs {
			if admitted[i] == phase && phase < len(plans[i]) {
				calls = append(calls, l.call(r, plans[i][phase]))
				who = append(who, i)
			}
		}
		if len(calls) == 0 {
			break
		}
		res, err := l.eval(ctx, l.admit, calls)
		if err != nil {
			undo(func(i int) bool { return admitted[i] < len(plans[i]) })
			return nil, fmt.Errorf("throttle: admit: %w", err)
		}
		for k, i := range who {
			g, err := parseGroup(res[k])
			if err != nil {
				undo(func(i int) bool { return admitted[i] < len(plans[i]) })
				return nil, err
			}
			merge(&ds[i], g, rs[i], plans[i][phase], phase)
			if g.allowed {
				admitted[i]++
				consumed[i] = append(consumed[i], g.freshTakes(plans[i][phase]))
			}
		}
	}
	undo(func(i int) bool { return !ds[i].Allowed })
	return ds, nil
}

// compensate releases what this call consumed for the requests that match,
// so that a request denied (or failed) part way leaves nothing behind, and
// what a task held before (a redelivery) stays held. It is best effort: if
// it fails, the entries stay until the task is admitted again (which finds
// them its own) or they expire.
func (l *Limiter) compensate(ctx context.Context, rs []Request, consumed [][]group, match func(int) bool) {
	var calls []call
	for i, r := range rs {
		if !match(i) {
			continue
		}
		for _, g := range consumed[i] {
			if len(g.takes) > 0 {
				calls = append(calls, l.call(r, g))
			}
		}
	}
	if len(calls) > 0 {
		_, _ = l.eval(context.WithoutCancel(ctx), l.release, calls)
	}
}

// Pause drains bucket b's tokens for subject key so that its next token is
// due in d, for every Limiter on this Redis: the way to honour a provider's
// Retry-After across a fleet. Reservations already made are kept. It returns
// the time until the bucket's next token.
func (l *Limiter) Pause(ctx context.Context, b *Bucket, key string, d time.Duration) (time.Duration, error) {
	r := Request{ID: "pause", Takes: []Take{{Rule: b, Key: key}}, MaxWait: d}
	if err := r.validate(); err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("throttle: pause %s for %q: must be positive (got %s): %w", b.Name(), key, d, ErrInvalidRequest)
	}
	c := l.call(r, l.plan(r)[0])
	res, err := l.eval(ctx, l.pause, []call{c})
	if err != nil {
		return 0, fmt.Errorf("throttle: pause %s for %q: %w", b.Name(), key, err)
	}
	us, _ := res[0].(int64)
	return time.Duration(us) * time.Microsecond, nil
}
