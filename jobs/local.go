package jobs

import (
	"slices"
	"sync"
	"time"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// zones keeps, per policy and time zone, the policy's calendar windows and
// quiet hours placed in that zone around one local day (throttle.Calendar.In,
// throttle.QuietHours.In), so that a job costs a map lookup rather than
// loading its zone and computing bounds. An entry is made again once the
// worker's clock is on another local day, or the policy changed (a
// reload). The zero value is ready.
type zones struct {
	mu sync.Mutex
	m  map[zoneKey]*zoneRules
}

type zoneKey struct{ policy, zone string }

type zoneRules struct {
	from  PolicySettings // what they were made from: a reload makes them again
	loc   *time.Location
	day   int // the local date they were made for, as yyyymmdd
	rules []throttle.Rule
}

// same reports whether a and b have the same calendar windows, quiet hours
// and zone (a reloaded config builds new ones).
func same(a, b PolicySettings) bool {
	return a.Quiet == b.Quiet && a.Zone == b.Zone && slices.Equal(a.Calendars, b.Calendars)
}

func yyyymmdd(t time.Time) int {
	y, m, d := t.Date()
	return y*10000 + int(m)*100 + d
}

// takes returns the takes of the policy's calendar windows and quiet hours
// for recipient in zone ("": the policy's). An unknown zone is a bad
// payload (message.Decode checks it; a worker whose time zone data lacks a zone
// the producer's had still archives rather than guesses).
func (z *zones) takes(p PolicySettings, policy, zone, recipient string, now time.Time) ([]throttle.Take, error) {
	if len(p.Calendars) == 0 && p.Quiet == nil {
		return nil, nil
	}
	k := zoneKey{policy, zone}
	z.mu.Lock()
	defer z.mu.Unlock()
	e := z.m[k]
	if e == nil || !same(e.from, p) {
		loc := p.Zone
		if zone != "" {
			var err error
			if loc, err = message.LoadZone(zone); err != nil {
				return nil, err
			}
		}
		if loc == nil {
			loc = time.UTC
		}
		e = &zoneRules{from: p, loc: loc}
		if z.m == nil {
			z.m = map[zoneKey]*zoneRules{}
		}
		z.m[k] = e
	}
	if day := yyyymmdd(now.In(e.loc)); day != e.day {
		e.day, e.rules = day, e.rules[:0:0]
		for _, c := range p.Calendars {
			e.rules = append(e.rules, c.In(e.loc, now))
		}
		if p.Quiet != nil {
			e.rules = append(e.rules, p.Quiet.In(e.loc, now))
		}
	}
	ts := make([]throttle.Take, len(e.rules))
	for i, r := range e.rules {
		ts[i] = throttle.Take{Rule: r, Subject: recipient}
	}
	return ts, nil
}
