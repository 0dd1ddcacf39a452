package throttle

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// Period is the length of a calendar window: a day, a week or a month of a
// time zone's calendar.
type Period int

// The periods of a Calendar.
const (
	Day Period = iota + 1
	Week
	Month
)

// String returns "day", "week" or "month".
func (p Period) String() string {
	if p >= Day && p <= Month {
		return [...]string{Day: "day", Week: "week", Month: "month"}[p]
	}
	return "Period(" + strconv.Itoa(int(p)) + ")"
}

// Calendar is a quota per calendar period: at most a limit per day, week or
// month of the recipient's calendar, windows starting at local midnight
// (a week on its start day). It is not itself a rule: In places it in a
// time zone around a moment, giving the CalendarWindow a request takes. The
// windows of different zones share the subject's entries, which are
// absolute moments, so a recipient whose zone changes keeps its history.
type Calendar struct {
	name      string
	limit     int
	period    Period
	weekStart time.Weekday
	str       string
}

// NewCalendar returns a calendar quota of limit per period. weekStart is the
// first day of a Week (ignored for other periods). The name must differ
// from every other calendar quota's: it names the quota's Redis keys.
func NewCalendar(name string, limit int, period Period, weekStart time.Weekday) (*Calendar, error) {
	if err := checkName("calendar", name); err != nil {
		return nil, err
	}
	if period < Day || period > Month {
		return nil, invalidRule("calendar "+name, "period must be Day, Week or Month (got %d)", period)
	}
	if weekStart < time.Sunday || weekStart > time.Saturday {
		return nil, invalidRule("calendar "+name, "week start must be a weekday (got %d)", weekStart)
	}
	c := &Calendar{name: name, limit: limit, period: period, weekStart: weekStart}
	c.str = fmt.Sprintf("%d per calendar %s", limit, period)
	if period == Week && weekStart != time.Monday {
		c.str += " from " + weekStart.String()
	}
	if err := checkLimit("calendar "+name+" ("+c.str+")", "limit", limit); err != nil {
		return nil, err
	}
	return c, nil
}

// Name returns the calendar quota's name.
func (c *Calendar) Name() string { return c.name }

// String returns e.g. "1 per calendar day" or "3 per calendar week from Sunday".
func (c *Calendar) String() string { return c.str }

// How many windows In places before and after the one holding its moment:
// enough that a worker's clock off by a day still covers Redis time, and
// that a booking finds its window for weeks ahead.
const calendarBehind = 1

func (p Period) ahead() int { return [...]int{Day: 15, Week: 8, Month: 4}[p] }

// Start returns the start of the window holding t, in loc.
func (c *Calendar) Start(loc *time.Location, t time.Time) time.Time {
	y, m, d := t.In(loc).Date()
	switch c.period {
	case Week:
		back := (int(t.In(loc).Weekday()) - int(c.weekStart) + 7) % 7
		return midnight(y, m, d-back, loc)
	case Month:
		return midnight(y, m, 1, loc)
	}
	return midnight(y, m, d, loc)
}

// next returns the start of the window after the one starting at s.
func (c *Calendar) next(loc *time.Location, s time.Time) time.Time {
	y, m, d := s.In(loc).Date()
	switch c.period {
	case Week:
		return midnight(y, m, d+7, loc)
	case Month:
		return midnight(y, m+1, 1, loc)
	}
	return midnight(y, m, d+1, loc)
}

// midnight returns the first moment of a day in loc (see wall).
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time { return wall(y, m, d, 0, loc) }

// wall returns the moment of local time of day c (from 0 to 24h) on a day
// in loc. A time the clock skips (a daylight-saving change moving it from
// 02:00 to 03:00, or in America/Santiago from 00:00 to 01:00) is the moment
// the clock jumps; a time it repeats is its first occurrence.
func wall(y int, m time.Month, d int, c time.Duration, loc *time.Location) time.Time {
	h, mi := int(c/time.Hour), int(c%time.Hour/time.Minute)
	t := time.Date(y, m, d, h, mi, 0, 0, loc)
	want := time.Date(y, m, d, h, mi, 0, 0, time.UTC)
	ty, tm, td := t.Date()
	th, tmi, _ := t.Clock()
	got := time.Date(ty, tm, td, th, tmi, 0, 0, time.UTC)
	switch start, end := t.ZoneBounds(); {
	case got.Before(want): // placed before the jump
		return end
	case got.After(want): // placed after it
		return start
	}
	return t
}

// Bounds returns the starts of the windows in loc from one before the
// window holding t to several after it (the last is the end of the one
// before it): daylight-saving changes give 23- and 25-hour days.
func (c *Calendar) Bounds(loc *time.Location, t time.Time) []time.Time {
	s := c.Start(loc, t)
	for range calendarBehind {
		s = c.Start(loc, s.Add(-time.Hour))
	}
	n := calendarBehind + 1 + c.period.ahead()
	bs := make([]time.Time, 0, n+1)
	for range n + 1 {
		bs = append(bs, s)
		s = c.next(loc, s)
	}
	return bs
}

// In returns the rule that counts this calendar quota's windows in loc
// around t (docs/rules.md, "How it is decided").
func (c *Calendar) In(loc *time.Location, t time.Time) *CalendarWindow {
	w, err := NewCalendarWindow(c.name, c.limit, c.Bounds(loc, t)...)
	if err != nil {
		panic(err) // Bounds are increasing, the name and limit checked
	}
	w.str = c.str
	return w
}

// CalendarWindow is the rule of a Calendar placed in time: a limit per
// window, the windows given by their bounds (absolute moments). Entries are
// kept in one sorted set per subject; an entry counts in the window that
// holds its moment.
type CalendarWindow struct {
	rule   // plan: ",limit,bound,bound..."
	limit  int
	bounds []time.Time
}

// NewCalendarWindow returns a rule of limit per window, windows from
// bounds[i] to bounds[i+1]. The bounds must increase; a moment outside
// [bounds[0], bounds[len-1]) is not covered and fails an admission.
func NewCalendarWindow(name string, limit int, bounds ...time.Time) (*CalendarWindow, error) {
	if err := checkName("calendar", name); err != nil {
		return nil, err
	}
	if err := checkLimit("calendar "+name, "limit", limit); err != nil {
		return nil, err
	}
	if len(bounds) < 2 {
		return nil, invalidRule("calendar "+name, "needs at least two bounds")
	}
	var b strings.Builder
	b.WriteString("," + strconv.Itoa(limit))
	for i, t := range bounds {
		if i > 0 && !t.After(bounds[i-1]) {
			return nil, invalidRule("calendar "+name, "bound %d (%s) is not after the one before", i+1, t)
		}
		b.WriteString("," + strconv.FormatInt(t.UnixMicro(), 10))
	}
	return &CalendarWindow{rule: rule{name: name, letter: "c", plan: b.String(), str: fmt.Sprintf("%d per calendar window", limit)},
		limit: limit, bounds: append([]time.Time(nil), bounds...)}, nil
}

// MaxCost returns the limit, or MaxQuotaCost if that is less.
func (w *CalendarWindow) MaxCost() int { return min(w.limit, MaxQuotaCost) }

func (w *CalendarWindow) keyCount() int { return 1 }

func (w *CalendarWindow) appendKeys(dst []any, tag string) []any {
	return append(dst, keyspace.Calendar(tag, w.name))
}
