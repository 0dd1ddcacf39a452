package throttle

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/timefmt"
)

// ErrInvalidRule is wrapped by every error that rejects a rule, or a take that
// no rule could ever admit, when it is built.
var ErrInvalidRule = errors.New("invalid rule")

// RuleError says what is wrong with a rule: Rule names it ("quota q",
// `bucket name "sms gateway"`, "quota q: window 2 (3 per 0s)") and Problem
// says what is wrong. The constructors return it wrapped as "throttle:
// <Rule>: <Problem>: invalid rule"; a caller that names the rule its own
// way, as package config names the setting, takes it out with errors.As.
type RuleError struct {
	Rule, Problem string
}

// Error returns "<Rule>: <Problem>".
func (e *RuleError) Error() string { return e.Rule + ": " + e.Problem }

// invalidRule returns a *RuleError wrapped as the constructors return it.
func invalidRule(rule, format string, args ...any) error {
	return fmt.Errorf("throttle: %w: %w", &RuleError{Rule: rule, Problem: fmt.Sprintf(format, args...)}, ErrInvalidRule)
}

// Rule is a limit that takes are checked against: a *Quota, a *Bucket, a
// *CalendarWindow or a *Quiet. Rules hold no state (their state lives in
// Redis, keyed by rule name and subject), are immutable, and are safe for
// concurrent use.
type Rule interface {
	// Name returns the rule's name, which is part of its Redis keys.
	Name() string
	// MaxCost returns the largest cost a single take can ever be admitted with.
	MaxCost() int
	// String describes the limit, e.g. "3 per 168h" or "100/s burst 20".
	String() string

	// kind is the rule's letter in the scripts' calling convention.
	kind() string
	// appendKeys appends the rule's keys for a subject's hash tag.
	appendKeys(dst []any, tag string) []any
	// keyCount is how many keys appendKeys appends.
	keyCount() int
	// appendPlan appends the rule's take of this cost to a plan (see
	// lua/rules.lua): its kind, the cost, then its limits.
	appendPlan(dst []byte, cost int) []byte
	// bindingLimit describes the limit that binds: String(), or for a quota the
	// window (1-based) the script reports, if any. Formatted once, when the
	// rule is built.
	bindingLimit(window int) string
}

// rule is what every Rule holds: its name, the letter of its kind in the
// scripts' calling convention, its limits as plans carry them (after the
// take's cost: see lua/rules.lua), and its String.
type rule struct{ name, letter, plan, str string }

// Name returns the rule's name.
func (r *rule) Name() string { return r.name }

// String describes the limit.
func (r *rule) String() string { return r.str }

func (r *rule) kind() string { return r.letter }

func (r *rule) bindingLimit(int) string { return r.str }

func (r *rule) appendPlan(dst []byte, cost int) []byte {
	return append(strconv.AppendInt(append(append(dst, r.letter...), ','), int64(cost), 10), r.plan...)
}

// Bounds on rules, so that every number the scripts compute stays exact in
// a double and every TTL fits Redis.
const (
	// MaxLimit is the largest limit or burst a rule may have.
	MaxLimit = 1_000_000_000
	// MaxPer is the longest window, and the longest time a bucket may take
	// to fill: ten years.
	MaxPer = 10 * 365 * 24 * time.Hour
	// MaxQuotaCost is the largest cost of one quota take: each unit is a
	// sorted-set member.
	MaxQuotaCost = 1000
	// MinRate and MaxRate bound a bucket's tokens per second.
	MinRate, MaxRate = 1e-6, 1e9
	// MaxWindows is the most windows a quota may have.
	MaxWindows = 32
)

var ruleName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func checkName(kind, name string) error {
	if !ruleName.MatchString(name) {
		return invalidRule(fmt.Sprintf("%s name %q", kind, name), "must be 1-64 of A-Z a-z 0-9 _ . -")
	}
	return nil
}

// checkLimit rejects limits and bursts below 1 or above MaxLimit.
func checkLimit(where, what string, n int) error {
	if n < 1 || n > MaxLimit {
		return invalidRule(where, "%s must be from 1 to %d (got %d)", what, MaxLimit, n)
	}
	return nil
}

// Window is one sliding window of a Quota: at most Limit in any span of Per.
type Window struct {
	Limit int
	Per   time.Duration
}

// String returns e.g. "3 per 168h".
func (w Window) String() string { return fmt.Sprintf("%d per %s", w.Limit, timefmt.Duration(w.Per)) }

// Quota is a sliding-window quota kept in one sorted set per subject
// (docs/design.md, Algorithms): "1 per 24h and 3 per 168h" is one key.
type Quota struct {
	rule    // plan: ",limit,per_us" per window; str: e.g. "1 per 24h, 3 per 168h"
	windows []Window
	limits  []string // the windows' String()
}

// NewQuota returns a quota with the given windows. It fails if there is no
// window, a limit is outside [1, MaxLimit] or a window outside [1ms, MaxPer].
func NewQuota(name string, windows ...Window) (*Quota, error) {
	if err := checkName("quota", name); err != nil {
		return nil, err
	}
	if len(windows) == 0 {
		return nil, invalidRule("quota "+name, "needs at least one window")
	}
	if len(windows) > MaxWindows {
		return nil, invalidRule("quota "+name, "%d windows: at most %d", len(windows), MaxWindows)
	}
	q := &Quota{rule: rule{name: name, letter: "q"}, windows: append([]Window(nil), windows...)}
	for i, w := range windows {
		where := fmt.Sprintf("quota %s: window %d (%s)", name, i+1, w)
		if err := checkLimit(where, "limit", w.Limit); err != nil {
			return nil, err
		}
		if w.Per < time.Millisecond || w.Per > MaxPer { // the scripts count in µs
			return nil, invalidRule(where, "window must be from 1ms to %s (got %s)", timefmt.Duration(MaxPer), w.Per)
		}
		q.plan += "," + strconv.Itoa(w.Limit) + "," + strconv.FormatInt(w.Per.Microseconds(), 10)
		q.limits = append(q.limits, w.String())
	}
	q.str = strings.Join(q.limits, ", ")
	return q, nil
}

// WithMargin returns a copy of q that holds each window d longer than it
// says (docs/rules.md, "Held at the provider, with a margin"); its String
// and the limits it reports are q's. d must be from 0 to a minute.
func (q *Quota) WithMargin(d time.Duration) (*Quota, error) {
	if d < 0 || d > time.Minute {
		return nil, invalidRule("quota "+q.name, "margin must be from 0 to 1m (got %s)", d)
	}
	c := *q
	c.plan = ""
	for _, w := range q.windows {
		c.plan += "," + strconv.Itoa(w.Limit) + "," + strconv.FormatInt((w.Per+d).Microseconds(), 10)
	}
	return &c, nil
}

// Longest returns its longest window: how long an entry counts.
func (q *Quota) Longest() time.Duration {
	var longest time.Duration
	for _, w := range q.windows {
		longest = max(longest, w.Per)
	}
	return longest
}

// MaxCost returns the smallest window limit, or MaxQuotaCost if that is less.
func (q *Quota) MaxCost() int {
	m := MaxQuotaCost
	for _, w := range q.windows {
		m = min(m, w.Limit)
	}
	return m
}

func (q *Quota) bindingLimit(window int) string {
	if window > 0 && window <= len(q.limits) {
		return q.limits[window-1]
	}
	return q.str
}

func (q *Quota) keyCount() int { return 1 }

func (q *Quota) appendKeys(dst []any, tag string) []any {
	return append(dst, keyspace.Quota(tag, q.name))
}

// Bucket is a token bucket: it holds at most Burst tokens and gains Rate
// tokens per second; a take of cost n needs n tokens.
type Bucket struct {
	rule    // plan: ",rate,burst[,reserve]"; str: e.g. "100/s burst 20"
	rate    float64
	burst   int
	reserve int // tokens only priority requests may take
}

// NewBucket returns a bucket refilled at rate tokens per second (fractions
// such as 0.2 allowed) holding at most burst tokens. It fails unless rate is
// within [MinRate, MaxRate], burst within [1, MaxLimit] and the bucket fills
// within MaxPer.
func NewBucket(name string, rate float64, burst int) (*Bucket, error) {
	if err := checkName("bucket", name); err != nil {
		return nil, err
	}
	if !(rate >= MinRate && rate <= MaxRate) {
		return nil, invalidRule("bucket "+name, "rate must be from %g to %g tokens per second (got %v)", MinRate, MaxRate, rate)
	}
	if err := checkLimit("bucket "+name, "burst", burst); err != nil {
		return nil, err
	}
	if fill := float64(burst) / rate; fill > MaxPer.Seconds() {
		return nil, invalidRule("bucket "+name, "burst %d at %v/s takes longer than %s to fill", burst, rate, timefmt.Duration(MaxPer))
	}
	r := strconv.FormatFloat(rate, 'g', -1, 64)
	return &Bucket{rule: rule{name: name, letter: "b", plan: "," + r + "," + strconv.Itoa(burst),
		str: r + "/s burst " + strconv.Itoa(burst)}, rate: rate, burst: burst}, nil
}

// Rate returns the tokens added per second.
func (b *Bucket) Rate() float64 { return b.rate }

// Burst returns the bucket's capacity.
func (b *Bucket) Burst() int { return b.burst }

// MaxCost returns the burst less the reserve: the most one request without
// priority can take.
func (b *Bucket) MaxCost() int { return b.burst - b.reserve }

// WithReserve returns a copy of b that keeps n of its burst for requests
// with Booking.Priority: others take tokens only while n more would be left
// (docs/booking.md, Priority). n must be from 0 to burst - 1.
func (b *Bucket) WithReserve(n int) (*Bucket, error) {
	if n < 0 || n >= b.burst {
		return nil, invalidRule("bucket "+b.name, "reserve must be from 0 to burst - 1 (%d) (got %d)", b.burst-1, n)
	}
	c := *b
	c.reserve = n
	c.plan = "," + strconv.FormatFloat(b.rate, 'g', -1, 64) + "," + strconv.Itoa(b.burst)
	if n > 0 {
		c.plan += "," + strconv.Itoa(n)
	}
	return &c, nil
}

func (b *Bucket) keyCount() int { return 5 }

func (b *Bucket) appendKeys(dst []any, tag string) []any {
	return append(dst, keyspace.Bucket(tag, b.name), keyspace.Book(tag, b.name), keyspace.Slots(tag, b.name),
		keyspace.Fair(tag, b.name), keyspace.Tenants(tag, b.name))
}
