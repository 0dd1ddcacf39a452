package config

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/throttle"
)

// Rules builds a quota per policy and a bucket per provider, each named
// like it. An error names the policy or provider (and the file and line)
// and wraps throttle.ErrInvalidRule; a Config from Load or Parse has none.
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
		if len(c.Policies[name].Windows) > 0 { // else calendar windows alone
			q, err := throttle.NewQuota(name, c.Policies[name].Windows...)
			if err == nil {
				q, err = q.WithMargin(c.Worker.WindowMargin)
			}
			if !c.ruleOK(errs, path, err) {
				continue
			}
			quotas[name] = q
		}
		c.local(errs, name)
	}
	buckets := map[string]*throttle.Bucket{}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		path, p := join("providers", name), c.Providers[name]
		if !ok(path) {
			continue
		}
		b, err := throttle.NewBucket(name, p.Rate, p.Burst)
		if err == nil {
			b, err = b.WithReserve(p.PriorityReserve)
		}
		if c.ruleOK(errs, path, err) {
			buckets[name] = b
		}
	}
	return quotas, buckets
}

// ruleOK reports whether a throttle constructor's err is nil, else adds it
// at path, which names the rule, so the message is the RuleError alone.
func (c *Config) ruleOK(errs *errorList, path string, err error) bool {
	if err == nil {
		return true
	}
	msg := err.Error()
	if re := (*throttle.RuleError)(nil); errors.As(err, &re) {
		msg = re.Error()
	}
	e := c.src.errorAt(path, msg)
	e.Err = err
	*errs = append(*errs, e)
	return false
}

// Local returns a policy's parts kept in the recipient's zone: calendar
// windows, quiet hours (nil: none) and the zone (default UTC). A Config
// from Load or Parse has passed these checks already.
func (c *Config) Local(policy string) ([]*throttle.Calendar, *throttle.QuietHours, *time.Location, error) {
	var errs errorList
	cals, quiet, loc := c.local(&errs, policy)
	return cals, quiet, loc, errs.err()
}

// calendarName names a calendar window's rule: "marketing.day", and a
// week's start unless Monday, "marketing.week.sunday".
func calendarName(policy string, cw Calendar) string {
	name := policy + "." + cw.Per
	if cw.Per == "week" && cw.WeekStart != "" && cw.WeekStart != "monday" {
		name += "." + cw.WeekStart
	}
	return name
}

// local builds a policy's calendar windows and quiet hours, reporting what
// throttle rejects (quiet ranges Validate rejects are skipped).
func (c *Config) local(errs *errorList, policy string) ([]*throttle.Calendar, *throttle.QuietHours, *time.Location) {
	pol, path := c.Policies[policy], join("policies", policy)
	var cals []*throttle.Calendar
	for _, cw := range pol.Calendar {
		start, period := time.Monday, throttle.Period(0)
		for d := range time.Weekday(7) {
			if strings.ToLower(d.String()) == cw.WeekStart {
				start = d
			}
		}
		for p := throttle.Day; p <= throttle.Month; p++ {
			if p.String() == cw.Per {
				period = p
			}
		}
		if cal, err := throttle.NewCalendar(calendarName(policy, cw), cw.Limit, period, start); c.ruleOK(errs, path+".calendar", err) {
			cals = append(cals, cal)
		}
	}
	var quiet *throttle.QuietHours
	if len(pol.Quiet) > 0 {
		var rs []throttle.QuietRange
		for _, s := range pol.Quiet {
			if r, err := throttle.ParseQuietRange(s); err == nil {
				rs = append(rs, r)
			}
		}
		var err error
		quiet, err = throttle.NewQuietHours(policy, rs...)
		c.ruleOK(errs, path+".quiet", err)
	}
	loc := time.UTC
	if pol.TimeZone != "" {
		loc, _ = timefmt.LoadZone(pol.TimeZone)
	}
	return cals, quiet, loc
}
