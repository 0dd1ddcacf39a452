package throttle

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// QuietRange is a span of local time that recurs daily, or on some
// weekdays: from From to To after local midnight, starting on the days in
// Days (all false: every day). To at or before From ends the next day
// (21:00-08:00); To may be 24h (00:00-24:00: the whole day).
type QuietRange struct {
	Days     [7]bool // by time.Weekday; all false: every day
	From, To time.Duration
}

var dayNames = [7]string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

// ParseQuietRange reads "21:00-08:00", "sun 00:00-24:00", "sat,sun
// 10:00-12:00" or "mon-fri 18:00-09:00". An empty range (from equal to
// to) is an error.
func ParseQuietRange(s string) (QuietRange, error) {
	var r QuietRange
	days, span, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok {
		days, span = "", days
	} else if err := parseDays(&r, days); err != nil {
		return r, err
	}
	from, to, ok := strings.Cut(strings.TrimSpace(span), "-")
	if !ok {
		return r, fmt.Errorf("not a range of local times like 21:00-08:00 (got %q)", s)
	}
	var err error
	if r.From, err = parseClock(from, false); err != nil {
		return r, err
	}
	if r.To, err = parseClock(to, true); err != nil {
		return r, err
	}
	if r.From == r.To || r.From == 0 && r.To == 24*time.Hour && days == "" {
		return r, fmt.Errorf("%q is empty or the whole of every day", s)
	}
	return r, nil
}

func parseDays(r *QuietRange, s string) error {
	for _, part := range strings.Split(strings.ToLower(s), ",") {
		a, b, span := strings.Cut(part, "-")
		i, j := slices.Index(dayNames[:], a), slices.Index(dayNames[:], b)
		if !span {
			j = i
		}
		if i < 0 || j < 0 {
			return fmt.Errorf("days %q: weekdays are sun, mon, tue, wed, thu, fri, sat (a list: sat,sun; a range: mon-fri)", s)
		}
		for k := i; ; k = (k + 1) % 7 {
			r.Days[k] = true
			if k == j {
				break
			}
		}
	}
	return nil
}

// parseClock reads HH:MM (24:00 only if end).
func parseClock(s string, end bool) (time.Duration, error) {
	h, m, ok := strings.Cut(s, ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || err1 != nil || err2 != nil || len(m) != 2 || hh < 0 || mm < 0 || mm > 59 || hh > 24 || hh == 24 && (mm != 0 || !end) {
		return 0, fmt.Errorf("%q is not a time of day from 00:00 to 23:59 (24:00 as an end)", s)
	}
	return time.Duration(hh)*time.Hour + time.Duration(mm)*time.Minute, nil
}

// String returns the range as ParseQuietRange reads it.
func (r QuietRange) String() string {
	var days []string
	for i, on := range r.Days {
		if on {
			days = append(days, dayNames[i])
		}
	}
	clock := func(d time.Duration) string { return fmt.Sprintf("%02d:%02d", int(d.Hours()), int(d.Minutes())%60) }
	s := clock(r.From) + "-" + clock(r.To)
	if len(days) > 0 {
		s = strings.Join(days, ",") + " " + s
	}
	return s
}

// on reports whether the range starts on weekday wd.
func (r QuietRange) on(wd time.Weekday) bool { return r.Days == [7]bool{} || r.Days[wd] }

// QuietHours are the spans of local time in which a policy sends nothing:
// a message that would go inside one waits until it ends. Like Calendar it
// is not itself a rule: In places it in a time zone around a moment.
type QuietHours struct {
	name   string
	ranges []QuietRange
	str    string
}

// NewQuietHours returns quiet hours of the given ranges. It fails if there
// is none, one is empty, or together they cover the whole week (nothing
// could ever be sent).
func NewQuietHours(name string, ranges ...QuietRange) (*QuietHours, error) {
	if err := checkName("quiet hours", name); err != nil {
		return nil, err
	}
	if len(ranges) == 0 {
		return nil, invalidRule("quiet hours "+name, "need at least one range")
	}
	q := &QuietHours{name: name, ranges: append([]QuietRange(nil), ranges...)}
	var strs []string
	for _, r := range ranges {
		if r.From == r.To || r.From < 0 || r.To < 0 || r.From >= 24*time.Hour || r.To > 24*time.Hour {
			return nil, invalidRule("quiet hours "+name, "range %s is empty or not within a day", r)
		}
		strs = append(strs, r.String())
	}
	q.str = "quiet " + strings.Join(strs, ", ")
	// Three weeks in UTC (no daylight saving): a merged span of a week or
	// more leaves no moment to send in.
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, s := range q.spans(time.UTC, t0, 0, 21) {
		if s.To.Sub(s.From) >= 7*24*time.Hour {
			return nil, invalidRule("quiet hours "+name+" ("+q.str[len("quiet "):]+")", "cover the whole week")
		}
	}
	return q, nil
}

// Name returns the quiet hours' name.
func (q *QuietHours) Name() string { return q.name }

// String returns e.g. "quiet 21:00-08:00, sun 00:00-24:00".
func (q *QuietHours) String() string { return q.str }

// Span is a stretch of absolute time, from From up to To.
type Span struct{ From, To time.Time }

// spans returns the quiet spans in loc of the ranges starting on the local
// days from the one holding t plus from days to plus to days, merged and in
// order. Every bound is a local time (see wall).
func (q *QuietHours) spans(loc *time.Location, t time.Time, from, to int) []Span {
	y, m, d := t.In(loc).Date()
	var ss []Span
	for i := from; i <= to; i++ {
		day := time.Date(y, m, d+i, 12, 0, 0, 0, loc)
		dy, dm, dd := day.Date()
		for _, r := range q.ranges {
			if !r.on(day.Weekday()) {
				continue
			}
			s := wall(dy, dm, dd, r.From, loc)
			e := wall(dy, dm, dd, r.To, loc)
			if r.To <= r.From {
				e = wall(dy, dm, dd+1, r.To, loc)
			}
			ss = append(ss, Span{s, e})
		}
	}
	slices.SortFunc(ss, func(a, b Span) int { return a.From.Compare(b.From) })
	var out []Span
	for _, s := range ss {
		if n := len(out); n > 0 && !s.From.After(out[n-1].To) {
			if s.To.After(out[n-1].To) {
				out[n-1].To = s.To
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

// How many local days around its moment In covers: a worker's clock off by
// a day still covers Redis time, and a booking sees a week ahead.
const quietBehind, quietAhead = 1, 9

// In returns the rule that holds messages in these quiet hours in loc
// around t (docs/rules.md, "How it is decided").
func (q *QuietHours) In(loc *time.Location, t time.Time) *Quiet {
	y, m, d := t.In(loc).Date()
	from, until := midnight(y, m, d-quietBehind, loc), midnight(y, m, d+quietAhead+1, loc)
	ss := q.spans(loc, t, -quietBehind-1, quietAhead)
	r, err := NewQuiet(q.name, from, until, ss...)
	if err != nil {
		panic(err) // the spans are merged and in order
	}
	r.str = q.str
	return r
}

// Quiet is the rule of QuietHours placed in time: a take is refused inside
// one of its spans, and held until the span ends. It covers the moments
// from From to Until; an admission at a Redis time outside fails. It keeps
// no state in Redis.
type Quiet struct {
	rule        // plan: ",from,until,span_from,span_to,..."
	from, until time.Time
	spans       []Span
}

// NewQuiet returns a rule that refuses the moments in spans, covering from
// to until. Spans must be in order and not touch; they are clipped to the
// cover.
func NewQuiet(name string, from, until time.Time, spans ...Span) (*Quiet, error) {
	if err := checkName("quiet hours", name); err != nil {
		return nil, err
	}
	if !until.After(from) {
		return nil, invalidRule("quiet hours "+name, "cover ends before it starts")
	}
	q := &Quiet{rule: rule{name: name, letter: "h", str: "quiet hours"}, from: from, until: until}
	us := func(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }
	q.plan = "," + us(from) + "," + us(until)
	for i, s := range spans {
		if !s.To.After(s.From) || i > 0 && !s.From.After(spans[i-1].To) {
			return nil, invalidRule("quiet hours "+name, "span %d (%s to %s) is empty, or not after the one before", i+1, s.From, s.To)
		}
		if !s.To.After(from) || !s.From.Before(until) {
			continue
		}
		if s.To.After(until) {
			s.To = until
		}
		q.spans = append(q.spans, s)
		q.plan += "," + us(s.From) + "," + us(s.To)
	}
	return q, nil
}

// MaxCost returns MaxLimit: a quiet take consumes nothing.
func (q *Quiet) MaxCost() int { return MaxLimit }

// Spans returns a copy of the quiet spans the rule holds.
func (q *Quiet) Spans() []Span { return append([]Span(nil), q.spans...) }

func (q *Quiet) keyCount() int { return 0 }

func (q *Quiet) appendKeys(dst []any, _ string) []any { return dst }
