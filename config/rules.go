package config

import (
	"errors"
	"maps"
	"slices"

	"github.com/notify-throttle/throttler/throttle"
)

// Rules builds the throttle rules of the configuration: a quota per policy
// and a bucket per provider, each named like its policy or provider. The
// names and limits are checked by throttle's constructors; an error says
// which policy or provider (and, for a loaded Config, the file and line) and
// wraps throttle.ErrInvalidRule. A Config from Load or Parse has passed
// these checks already.
func (c *Config) Rules() (policies map[string]*throttle.Quota, buckets map[string]*throttle.Bucket, err error) {
	var errs errorList
	policies, buckets = c.rules(&errs, func(string) bool { return true })
	if err := errs.err(); err != nil {
		return nil, nil, err
	}
	return policies, buckets, nil
}

// rules builds the rules of the policies and providers whose path passes
// ok, reporting what throttle rejects.
func (c *Config) rules(errs *errorList, ok func(path string) bool) (map[string]*throttle.Quota, map[string]*throttle.Bucket) {
	quotas := map[string]*throttle.Quota{}
	for _, name := range slices.Sorted(maps.Keys(c.Policies)) {
		path := join("policies", name)
		if !ok(path) {
			continue
		}
		q, err := throttle.NewQuota(name, c.Policies[name].Windows...)
		if err != nil {
			errs.add(c.ruleError(path, err))
			continue
		}
		quotas[name] = q
	}
	buckets := map[string]*throttle.Bucket{}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		path := join("providers", name)
		if !ok(path) {
			continue
		}
		p := c.Providers[name]
		b, err := throttle.NewBucket(name, p.Rate, p.Burst)
		if err == nil {
			b, err = b.WithReserve(p.PriorityReserve)
		}
		if err != nil {
			errs.add(c.ruleError(path, err))
			continue
		}
		buckets[name] = b
	}
	return quotas, buckets
}

// ruleError places a throttle constructor's error at the policy or provider,
// which names the rule: the message is the throttle.RuleError alone.
func (c *Config) ruleError(path string, err error) *Error {
	msg := err.Error()
	var re *throttle.RuleError
	if errors.As(err, &re) {
		msg = re.Error()
	}
	e := c.src.errorAt(path, msg)
	e.Err = err
	return e
}
