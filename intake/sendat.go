package intake

// A scheduled send (send_at, send_at_local): docs/design.md#enqueueing-notifications.

import (
	"fmt"
	"slices"
	"time"

	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/message"
)

// SendAtGrace is how far in the past a send_at may be and still be taken
// (and sent at once): a producer's clock may be a little ahead.
const SendAtGrace = time.Minute

// sendAt returns the moment e is scheduled for (nil: none), rounded as the
// task keeps it (message.WholeSecond), or why it is refused, naming the field
// it came from. policy is e's policy, in whose zone a time of day is read
// when e names none. The moment may not pass e's send_by.
func (c Checker) sendAt(e Entry, policy string, now time.Time) (*time.Time, error) {
	var at time.Time
	field := "send_at"
	switch {
	case e.SendAt != nil && e.SendAtLocal != "":
		return nil, fieldErr("send_at_local", "given with send_at: give one moment, an instant or a time of day")
	case e.SendAt != nil:
		at = *e.SendAt
		if at.Before(now.Add(-SendAtGrace)) {
			return nil, fieldErr("send_at", "%s is in the past (more than %s ago)", at.Format(time.RFC3339Nano), timefmt.Duration(SendAtGrace))
		}
	case e.SendAtLocal != "":
		field = "send_at_local"
		loc, err := c.zone(e.TZ, policy)
		if err != nil {
			return nil, reason(err)
		}
		if at, err = NextLocal(e.SendAtLocal, loc, now); err != nil {
			return nil, fieldErr(field, "%v", err)
		}
	default:
		return nil, nil
	}
	at = message.WholeSecond(at)
	if e.SendBy != nil && at.After(*e.SendBy) {
		what := at.Format(time.RFC3339)
		if field == "send_at_local" {
			what = fmt.Sprintf("%s (%s)", e.SendAtLocal, at.Format(time.RFC3339))
		}
		return nil, fieldErr(field, "%s is after send_by %s: it would only expire", what, e.SendBy.Format(time.RFC3339Nano))
	}
	return &at, nil
}

// zone is the recipient's time zone: tz, else the policy's, else UTC.
func (c Checker) zone(tz, policy string) (*time.Location, error) {
	if tz != "" {
		return message.LoadZone(tz)
	}
	if p, ok := c.Config.Policies[policy]; ok && p.TimeZone != "" {
		return timefmt.LoadZone(p.TimeZone) // the config's validation loaded it already
	}
	return time.UTC, nil
}

// NextLocal returns the first moment after now at which the clock of loc
// reads clock, a time of day "HH:MM" or "HH:MM:SS" (24-hour). On a day
// its zone skips that time (clocks go forward over it), the moment is the
// first instant after the gap; on a day it reads it twice (clocks go
// back), the first of the two, or the second once the first has passed.
func NextLocal(clock string, loc *time.Location, now time.Time) (time.Time, error) {
	hour, minute, second, ok := parseClock(clock)
	if !ok {
		return time.Time{}, fmt.Errorf("must be a time of day HH:MM or HH:MM:SS such as 09:00 (got %s)", Quote(clock))
	}
	y, m, d := now.In(loc).Date()
	for day := 0; ; day++ {
		for _, at := range readings(time.Date(y, m, d+day, hour, minute, second, 0, time.UTC), loc) {
			if at.After(now) {
				return at, nil
			}
		}
	}
}

// readings returns the instants, earliest first, at which loc's clock
// reads wall's date and time (wall is that reading as if in UTC): one, two
// where the zone's clocks go back over it, or, where they jump over it,
// the instant they jump (the end of the gap). time.Date does not say which
// of two readings it picks, nor where a skipped one lands.
func readings(wall time.Time, loc *time.Location) []time.Time {
	var out []time.Time
	// A zone changes its offset at most once within a day or so: the
	// offsets a day either side are the two the reading can be in.
	for _, near := range []time.Time{wall.Add(-24 * time.Hour), wall.Add(24 * time.Hour)} {
		_, offset := near.In(loc).Zone()
		at := wall.Add(-time.Duration(offset) * time.Second).In(loc)
		reads := at.Format(time.DateTime) == wall.Format(time.DateTime) // at's clock reads wall's
		if reads && !slices.ContainsFunc(out, at.Equal) {
			out = append(out, at)
		}
	}
	if len(out) == 0 {
		// Skipped: read with the offset before the jump, the reading lands
		// past it, in the zone period that starts at the jump.
		_, before := wall.Add(-24 * time.Hour).In(loc).Zone()
		start, _ := wall.Add(-time.Duration(before) * time.Second).In(loc).ZoneBounds()
		return []time.Time{start}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// parseClock reads "HH:MM" or "HH:MM:SS", two digits each, 00:00 to
// 23:59:59.
func parseClock(s string) (hour, minute, second int, ok bool) {
	if len(s) != 5 && len(s) != 8 {
		return 0, 0, 0, false
	}
	t, err := time.Parse("15:04:05"[:len(s)], s) // one-digit hours cannot make either length
	return t.Hour(), t.Minute(), t.Second(), err == nil
}
