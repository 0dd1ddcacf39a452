// Package screen keeps, per provider, what is checked just before a send:
// the scoped pauses a provider asked for (one device, number pair or
// sender) and the addresses it reported dead (suppressions). The worker
// screens the messages of a providers.Scoper; see docs/providers.md.
package screen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/throttle"
)

// Screen keeps, per provider, the scoped pauses (keys that expire when the
// pause ends, by Redis's clock) and the suppressed addresses (until an
// operator lifts them). Safe for concurrent use.
type Screen struct {
	rdb    redis.UniversalClient
	prefix string
}

// New returns the screen on rdb under the throttle's key prefix (""
// means throttle.DefaultPrefix).
func New(rdb redis.UniversalClient, prefix string) *Screen {
	return &Screen{rdb: rdb, prefix: cmp.Or(prefix, throttle.DefaultPrefix)}
}

// Suppression is a dead address of a provider.
type Suppression struct {
	Address string    `json:"-"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"` // the worker's clock, for people
}

// Check returns, in one round trip, the suppression of recipient (nil if
// none) and the longest time left on the holds of scopes (0 if none).
func (s *Screen) Check(ctx context.Context, provider, recipient string, scopes []string) (*Suppression, time.Duration, error) {
	pipe := s.rdb.Pipeline()
	sup := pipe.HGet(ctx, suppressedKey(s.prefix, provider), recipient)
	ttls := make([]*redis.DurationCmd, len(scopes))
	for i, sc := range scopes {
		ttls[i] = pipe.PTTL(ctx, holdKey(s.prefix, provider, sc))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("screen: %s: %w", provider, err)
	}
	var hold time.Duration
	for _, c := range ttls {
		hold = max(hold, c.Val()) // -1 and -2 (no expiry, no key) count as none
	}
	if sup.Err() != nil {
		return nil, hold, nil
	}
	var su Suppression
	if err := json.Unmarshal([]byte(sup.Val()), &su); err != nil {
		su.Reason = sup.Val()
	}
	su.Address = recipient
	return &su, hold, nil
}

// Hold pauses one scope of a provider until at, by Redis's clock, or if at
// is zero for d.
func (s *Screen) Hold(ctx context.Context, provider, scope string, d time.Duration, at time.Time) error {
	args := redis.SetArgs{TTL: max(d, time.Millisecond)}
	if !at.IsZero() {
		args = redis.SetArgs{ExpireAt: at}
	}
	if err := s.rdb.SetArgs(ctx, holdKey(s.prefix, provider, scope), 1, args).Err(); err != nil {
		return fmt.Errorf("screen: hold %s %s: %w", provider, scope, err)
	}
	return nil
}

// Until returns how long from now, by Redis's clock, until at (at least a
// millisecond).
func (s *Screen) Until(ctx context.Context, at time.Time) (time.Duration, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("screen: redis time: %w", err)
	}
	return max(at.Sub(now), time.Millisecond), nil
}

// Suppress records address as dead for provider, with the reason.
func (s *Screen) Suppress(ctx context.Context, provider, address, reason string, at time.Time) error {
	v, _ := json.Marshal(Suppression{Reason: reason, At: at.UTC().Truncate(time.Second)})
	if err := s.rdb.HSet(ctx, suppressedKey(s.prefix, provider), address, v).Err(); err != nil {
		return fmt.Errorf("screen: suppress for %s: %w", provider, err)
	}
	return nil
}

// Suppressions returns provider's suppressed addresses, sorted.
func (s *Screen) Suppressions(ctx context.Context, provider string) ([]Suppression, error) {
	all, err := s.rdb.HGetAll(ctx, suppressedKey(s.prefix, provider)).Result()
	if err != nil {
		return nil, fmt.Errorf("screen: suppressions of %s: %w", provider, err)
	}
	out := make([]Suppression, 0, len(all))
	for addr, v := range all {
		var su Suppression
		if json.Unmarshal([]byte(v), &su) != nil {
			su.Reason = v
		}
		su.Address = addr
		out = append(out, su)
	}
	slices.SortFunc(out, func(a, b Suppression) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}

// Unsuppress lifts the suppression of address for provider and reports
// whether there was one.
func (s *Screen) Unsuppress(ctx context.Context, provider, address string) (bool, error) {
	n, err := s.rdb.HDel(ctx, suppressedKey(s.prefix, provider), address).Result()
	if err != nil {
		return false, fmt.Errorf("screen: unsuppress for %s: %w", provider, err)
	}
	return n > 0, nil
}
