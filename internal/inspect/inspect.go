// Package inspect reads the throttle engine's state in Redis for the
// operator's views: each provider's bucket, bookings and pause, and a
// recipient's windows, when each entry frees and the next moment a message
// may go. It only reads, and a call costs a bounded number of Redis
// commands, however many recipients and keys exist: it never scans the
// keyspace, and every list is read a page at a time.
//
// Times come from Redis TIME on the node that holds the keys read, as the
// engine's decisions do. On a Redis Cluster each subject's keys are read on
// their own node.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// SendBins and SendBin shape the sends-per-second series of a provider: the
// bins its bucket counts in (30 of 10 s, the last five minutes).
const (
	SendBins = keyspace.SentBins
	SendBin  = keyspace.SentBin * time.Microsecond
)

// Policy is a recipient policy as the config defines it.
type Policy struct {
	Name    string
	Windows []Window
	// Margin is how much longer than it says the engine holds each window
	// (worker.window_margin: throttle.Quota.WithMargin).
	Margin time.Duration
}

// Window is one of a policy's sliding windows.
type Window struct {
	Limit int
	Per   time.Duration
}

// Provider is a provider's bucket as the config defines it.
type Provider struct {
	Name  string
	Rate  float64 // tokens per second
	Burst int
}

// Inspector reads the state of the policies and providers it is given, under
// one key prefix. It is safe for concurrent use.
type Inspector struct {
	rdb       redis.UniversalClient
	prefix    string
	policies  []Policy
	providers []Provider
}

// New returns an Inspector of rdb's throttle state under prefix.
func New(rdb redis.UniversalClient, prefix string, policies []Policy, providers []Provider) *Inspector {
	ps := append([]Policy(nil), policies...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
	pr := append([]Provider(nil), providers...)
	sort.Slice(pr, func(i, j int) bool { return pr[i].Name < pr[j].Name })
	return &Inspector{rdb: rdb, prefix: prefix, policies: ps, providers: pr}
}

// Policies returns the policies, by name.
func (in *Inspector) Policies() []Policy { return in.policies }

// ProviderCount returns how many providers there are.
func (in *Inspector) ProviderCount() int { return len(in.providers) }

// ProviderState is a provider's bucket now.
type ProviderState struct {
	Provider
	// Now is Redis's time on the bucket's node.
	Now time.Time
	// Tokens are the tokens the bucket could hand out now: its burst less
	// the slots taken or booked within burst/rate of now.
	Tokens float64
	// Bookings are the provider's booked tickets and the slots of tasks
	// that go after now.
	Bookings Bookings
	// PausedUntil is the end of a pause (a 429) in force; zero when none is.
	PausedUntil time.Time
	// Sends counts the takes in each of the last SendBins bins of SendBin,
	// oldest first, the last ending at Now.
	Sends []int64
}

// Providers returns the state of the providers from offset (by name), at
// most limit of them, and listing at most bookings of each one's bookings.
func (in *Inspector) Providers(ctx context.Context, offset, limit, bookings int) ([]ProviderState, error) {
	page := pageOf(in.providers, offset, limit)
	out := make([]ProviderState, len(page))
	var errs []error
	byNode, err := in.group(ctx, len(page), func(i int) string { return bucketKey(in.prefix, page[i].Name) })
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
				pr := page[i]
				tokens := readBucket(p, ctx, in.prefix, pr.Name, now, pr.Rate, pr.Burst)
				pause := readPause(p, ctx, in.prefix, pr.Name)
				slack := int64(math.Floor(float64(pr.Burst-1) * 1e6 / pr.Rate))
				books := readProviderBookings(p, ctx, in.prefix, pr.Name, now, slack, bookings)
				sends := readSends(p, ctx, in.prefix, pr.Name, now, SendBin.Microseconds(), SendBins)
				finish = append(finish, func() {
					out[i] = ProviderState{Provider: pr, Now: fromUS(now), Tokens: tokens(), Bookings: books(), Sends: sends()}
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
		return nil, fmt.Errorf("inspect: providers: %w", errors.Join(errs...))
	}
	return out, nil
}

// RecipientState is a recipient's history under every policy.
type RecipientState struct {
	Recipient string
	// Now is Redis's time on the recipient's node.
	Now      time.Time
	Policies []PolicyState
	// Bookings are the recipient's quota entries ahead of now, under every
	// policy together.
	Bookings Bookings
}

// PolicyState is a recipient's history under one policy.
type PolicyState struct {
	Policy
	// Used counts the entries in each window, as Windows, up to now.
	Used []int64
	// Ahead counts the entries booked ahead of now; each window counts
	// them too.
	Ahead int64
	// Frees is, per window, when the window next has a place: zero when it
	// has one now.
	Frees []time.Time
	// Next is the earliest moment a message may go under the policy: Now
	// when it may go now.
	Next time.Time
	// DecidedBy is the index in Windows of the window that sets Next; -1
	// when Next is Now; Booked when the recipient's last booking does (a
	// new booking goes after the ones made before it).
	DecidedBy int
	// Total counts the entries in the longest window; Entries is the page
	// of them asked for, newest first.
	Total   int64
	Entries []Entry
}

// Booked is PolicyState.DecidedBy when the recipient's last booking sets
// the next moment.
const Booked = -2

// Entry is one admission in a recipient's history.
type Entry struct {
	Task string
	At   time.Time
	// Frees is, per window, when the entry leaves it; zero when it is not
	// in that window any more.
	Frees []time.Time
}

// Recipient returns the recipient's history: for each policy the entries
// from offset (newest first, at most limit), and at most bookings of the
// bookings held for them. An unknown recipient has an empty history.
func (in *Inspector) Recipient(ctx context.Context, recipient string, offset, limit, bookings int) (RecipientState, error) {
	st := RecipientState{Recipient: recipient}
	if len(in.policies) == 0 {
		return st, nil
	}
	c, err := in.node(ctx, quotaKey(in.prefix, recipient, in.policies[0].Name))
	if err != nil {
		return st, err
	}
	now, err := redisNow(ctx, c)
	if err != nil {
		return st, err
	}
	st.Now = fromUS(now)
	reads := make([]func() quotaRead, len(in.policies))
	books := make([]func() Bookings, len(in.policies))
	wins := make([][]window, len(in.policies))
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, pol := range in.policies {
			for _, w := range pol.Windows {
				wins[i] = append(wins[i], window{limit: w.Limit, per: (w.Per + pol.Margin).Microseconds()})
			}
			reads[i] = readEntries(p, ctx, quotaKey(in.prefix, recipient, pol.Name), now, wins[i], offset, limit)
			books[i] = readRecipientBookings(p, ctx, in.prefix, recipient, pol.Name, now, bookings)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return st, fmt.Errorf("inspect: recipient: %w", err)
	}
	for i, pol := range in.policies {
		st.Policies = append(st.Policies, policyState(pol, wins[i], reads[i](), now))
		st.Bookings = merge(st.Bookings, books[i](), bookings)
	}
	return st, nil
}

// policyState turns what was read under one policy into when each window
// frees and the policy's next moment: a full window frees a place when the
// entry that decides it leaves, at its moment plus the window.
func policyState(pol Policy, wins []window, q quotaRead, now int64) PolicyState {
	ps := PolicyState{Policy: pol, Used: make([]int64, len(wins)), Ahead: q.ahead, Frees: make([]time.Time, len(wins)),
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
		next, ps.DecidedBy = q.newest, Booked
	}
	ps.Next = fromUS(next)
	for _, e := range q.entries {
		en := Entry{Task: e.Task, At: fromUS(e.At), Frees: make([]time.Time, len(wins))}
		for i, w := range wins {
			if e.At > now-w.per {
				en.Frees[i] = fromUS(e.At + w.per)
			}
		}
		ps.Entries = append(ps.Entries, en)
	}
	return ps
}

// group sorts n keys by the node that holds them: on a single node all go
// to rdb; on a cluster, to the master of each key's slot.
func (in *Inspector) group(ctx context.Context, n int, key func(int) string) (map[redis.Cmdable][]int, error) {
	out := map[redis.Cmdable][]int{}
	for i := 0; i < n; i++ {
		c, err := in.node(ctx, key(i))
		if err != nil {
			return nil, err
		}
		out[c] = append(out[c], i)
	}
	return out, nil
}

// node returns the client of the node that holds key.
func (in *Inspector) node(ctx context.Context, key string) (redis.Cmdable, error) {
	cc, ok := in.rdb.(*redis.ClusterClient)
	if !ok {
		return in.rdb, nil
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("inspect: the node of %q: %w", key, err)
	}
	return c, nil
}

// redisNow returns the node's TIME in µs.
func redisNow(ctx context.Context, c redis.Cmdable) (int64, error) {
	t, err := c.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("inspect: TIME: %w", err)
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
