// Package schedule reads the cron schedules and time zones of campaigns:
// the same ticks on every worker, whatever its start time or host.
package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // time zones mean the same on every host, tzdata installed or not

	"github.com/robfig/cron/v3"
)

// cronParser reads the standard 5 fields, an optional leading seconds
// field, and descriptors such as @daily. A Parser is immutable.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour |
	cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

const everyPrefix = "@every "

// Parse returns when spec fires: Next(t) is its first tick after t, a
// whole second. The fields are read in loc; a wall-clock time the zone
// repeats fires once. "@every d" (whole seconds) fires at the multiples of
// d since the Unix epoch, so that every worker computes the same ticks.
func Parse(spec string, loc *time.Location) (cron.Schedule, error) {
	spec = strings.TrimSpace(spec)
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return nil, errors.New("set the time zone with timezone:, not in the schedule")
	}
	if strings.HasPrefix(spec, everyPrefix) {
		d, err := time.ParseDuration(strings.TrimSpace(spec[len(everyPrefix):]))
		switch {
		case err != nil:
			return nil, errors.New("@every needs a duration such as 10m or 1h30m")
		case d < time.Second || d%time.Second != 0:
			return nil, errors.New("@every needs whole seconds, at least 1s")
		}
		return epochEvery(d), nil
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, err
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("unsupported schedule %T", s)
	}
	ss.Location = loc
	if ss.Next(time.Now()).IsZero() {
		return nil, errors.New("never fires")
	}
	return noFold{ss}, nil
}

// noFold skips the ticks that fall in the hour a time zone repeats when
// its clocks go back: "30 1 * * *" fires once on that night, at the first
// 01:30, as people expect, not twice.
type noFold struct{ *cron.SpecSchedule }

// Next returns the first tick after t whose wall-clock time has not been
// read before in the zone.
func (s noFold) Next(t time.Time) time.Time {
	for {
		t = s.SpecSchedule.Next(t)
		if t.IsZero() || !repeated(t.In(s.Location)) {
			return t
		}
	}
}

// repeated reports whether the wall-clock reading of t was also that of an
// earlier instant: t falls in the fold after clocks went back (by 30 min,
// 1h or 2h, the shifts zones use).
func repeated(t time.Time) bool {
	for _, back := range []time.Duration{30 * time.Minute, time.Hour, 2 * time.Hour} {
		e := t.Add(-back).In(t.Location())
		if e.Hour() == t.Hour() && e.Minute() == t.Minute() && e.Second() == t.Second() && e.YearDay() == t.YearDay() {
			return true
		}
	}
	return false
}

// Zone returns the time zone of an IANA name: UTC for "". "Local" is an
// error, as it differs from host to host.
func Zone(name string) (*time.Location, error) {
	if name == "Local" {
		return nil, errors.New(`"Local" differs from host to host: name the zone, e.g. Europe/Paris`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, errors.New("unknown time zone: an IANA name such as Europe/Paris or UTC")
	}
	return loc, nil
}

// epochEvery is "@every d" aligned on the Unix epoch.
type epochEvery time.Duration

// Next returns the first multiple of the period since the epoch after t.
func (e epochEvery) Next(t time.Time) time.Time {
	d := int64(time.Duration(e) / time.Second)
	s := t.Unix()
	next := (s/d + 1) * d
	if s < 0 && s%d != 0 {
		next -= d // Go's division truncates toward zero
	}
	return time.Unix(next, 0).In(t.Location())
}
