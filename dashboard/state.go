package dashboard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/throttle"
)

// The reads behind the views only read, at a bounded number of Redis
// commands however many recipients and keys exist, with the times of Redis
// TIME on each subject's node: docs/design.md#the-dashboard.

// sendBin is the width of a provider's sends-per-second bins, of which
// keyspace.SentBins end now.
const sendBin = keyspace.SentBin * time.Microsecond

// providerState is a provider's bucket now.
type providerState struct {
	Name        string
	Now         time.Time  // Redis's time on the bucket's node
	Tokens      float64    // what the bucket could hand out now (readBucket)
	Bookings    bookingSet // (readProviderBookings)
	PausedUntil time.Time  // zero when no pause is in force
	// Sends counts the workers' sends (throttle.Limiter.Sent) in each of
	// the last keyspace.SentBins bins of sendBin, oldest first, the last
	// ending at Now.
	Sends []int64
}

// readProviders returns the state of the page of providers from offset,
// listing at most bookings of each one's bookings.
func (l *live) readProviders(ctx context.Context, offset, limit, bookings int) ([]providerState, error) {
	page := pageOf(l.providers, offset, limit)
	out := make([]providerState, len(page))
	var errs []error
	prefix := l.cfg.Redis.Prefix
	byNode, err := l.group(ctx, len(page), func(i int) string { return bucketKey(prefix, page[i]) })
	if err != nil {
		return nil, err
	}
	for c, idx := range byNode {
		now, err := redisNow(ctx, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var finish []func()
		_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				name, pr := page[i], l.cfg.Providers[page[i]]
				tokens := readBucket(p, ctx, prefix, name, now, pr.Rate, pr.Burst)
				pause := readPause(p, ctx, prefix, name)
				slack := int64(math.Floor(float64(pr.Burst-1) * 1e6 / pr.Rate))
				books := readProviderBookings(p, ctx, prefix, name, now, slack, bookings)
				sends := readSends(p, ctx, prefix, name, now, sendBin.Microseconds(), keyspace.SentBins)
				finish = append(finish, func() {
					out[i] = providerState{Name: name, Now: fromUS(now), Tokens: tokens(), Bookings: books(), Sends: sends()}
					if until := pause(now); until > 0 {
						out[i].PausedUntil = fromUS(until)
					}
				})
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			errs = append(errs, err)
			continue
		}
		for _, f := range finish {
			f()
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("dashboard: providers: %w", errors.Join(errs...))
	}
	return out, nil
}

// recipientState is a recipient's history under every policy.
type recipientState struct {
	Now      time.Time // Redis's time on the recipient's node
	Policies []policyState
	Bookings bookingSet // quota entries ahead of now, every policy's together
}

// policyState is a recipient's history under one policy.
type policyState struct {
	Name    string
	Windows []throttle.Window
	Used    []int64     // entries in each window up to now
	Ahead   int64       // entries booked ahead of now, which each window counts too
	Frees   []time.Time // per window, when it next has a place; zero: now
	Next    time.Time   // the earliest moment a message may go
	// DecidedBy is the index in Windows of the window that sets Next; -1
	// when Next is now; byBookings when the recipient's last booking does
	// (a new booking goes after it).
	DecidedBy int
	Total     int64   // entries in the longest window
	Entries   []entry // the page of them asked for, newest first
}

const byBookings = -2

// entry is one admission in a recipient's history.
type entry struct {
	Task  string
	At    time.Time
	Frees []time.Time // per window, when it leaves it; zero when it has
}

// readRecipient returns the recipient's history: for each policy the page
// of entries from offset, and at most bookings of its bookings. An unknown
// recipient has an empty history.
func (l *live) readRecipient(ctx context.Context, recipient string, offset, limit, bookings int) (recipientState, error) {
	var st recipientState
	if len(l.policies) == 0 {
		return st, nil
	}
	prefix := l.cfg.Redis.Prefix
	c, err := l.node(ctx, quotaKey(prefix, recipient, l.policies[0]))
	if err != nil {
		return st, err
	}
	now, err := redisNow(ctx, c)
	if err != nil {
		return st, err
	}
	st.Now = fromUS(now)
	reads := make([]func() quotaRead, len(l.policies))
	books := make([]func() bookingSet, len(l.policies))
	wins := make([][]window, len(l.policies))
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range l.policies {
			for _, w := range l.cfg.Policies[name].Windows {
				wins[i] = append(wins[i], window{limit: w.Limit, per: (w.Per + l.cfg.Worker.WindowMargin).Microseconds()})
			}
			reads[i] = readEntries(p, ctx, quotaKey(prefix, recipient, name), now, wins[i], offset, limit)
			books[i] = readRecipientBookings(p, ctx, prefix, recipient, name, now, bookings)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return st, fmt.Errorf("dashboard: recipient: %w", err)
	}
	for i, name := range l.policies {
		st.Policies = append(st.Policies, newPolicyState(name, l.cfg.Policies[name].Windows, wins[i], reads[i](), now))
		st.Bookings = merge(st.Bookings, books[i](), bookings)
	}
	return st, nil
}

// newPolicyState turns what was read under one policy into when each window
// frees and the policy's next moment: a full window frees a place when its
// deciding entry leaves, at its moment plus the window and its margin.
func newPolicyState(name string, windows []throttle.Window, wins []window, q quotaRead, now int64) policyState {
	ps := policyState{Name: name, Windows: windows, Used: make([]int64, len(wins)), Ahead: q.ahead, Frees: make([]time.Time, len(wins)),
		Next: fromUS(now), DecidedBy: -1, Total: q.total}
	for i := range wins {
		ps.Used[i] = q.used[i] - q.ahead
	}
	next := now
	for i, w := range wins {
		if q.decider[i] < 0 {
			continue
		}
		at := q.decider[i] + w.per
		ps.Frees[i] = fromUS(at)
		if at > next {
			next, ps.DecidedBy = at, i
		}
	}
	if q.newest > next {
		next, ps.DecidedBy = q.newest, byBookings
	}
	ps.Next = fromUS(next)
	for _, e := range q.entries {
		en := entry{Task: e.Task, At: fromUS(e.At), Frees: make([]time.Time, len(wins))}
		for i, w := range wins {
			if e.At > now-w.per {
				en.Frees[i] = fromUS(e.At + w.per)
			}
		}
		ps.Entries = append(ps.Entries, en)
	}
	return ps
}

// group sorts n keys by the node that holds them (on a cluster, the master
// of each key's slot).
func (l *live) group(ctx context.Context, n int, key func(int) string) (map[redis.Cmdable][]int, error) {
	out := map[redis.Cmdable][]int{}
	for i := 0; i < n; i++ {
		c, err := l.node(ctx, key(i))
		if err != nil {
			return nil, err
		}
		out[c] = append(out[c], i)
	}
	return out, nil
}

func (l *live) node(ctx context.Context, key string) (redis.Cmdable, error) {
	cc, ok := l.rdb.(*redis.ClusterClient)
	if !ok {
		return l.rdb, nil
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("dashboard: the node of %q: %w", key, err)
	}
	return c, nil
}

func redisNow(ctx context.Context, c redis.Cmdable) (int64, error) {
	t, err := c.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("dashboard: TIME: %w", err)
	}
	return t.UnixMicro(), nil
}

func fromUS(us int64) time.Time { return time.UnixMicro(us).UTC() }

// pageOf returns the page [offset, offset+limit) of s.
func pageOf[T any](s []T, offset, limit int) []T {
	if offset >= len(s) {
		return nil
	}
	return s[offset:min(len(s), offset+limit)]
}
