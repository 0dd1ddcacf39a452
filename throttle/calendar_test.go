package throttle

import (
	"testing"
	"time"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustCalendar(t *testing.T, limit int, p Period, start time.Weekday) *Calendar {
	t.Helper()
	c, err := NewCalendar("cal", limit, p, start)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCalendarBounds checks window starts where the calendar is irregular:
// 23- and 25-hour days, week starts, month ends, a skipped midnight.
func TestCalendarBounds(t *testing.T) {
	ny, london, santiago := mustZone(t, "America/New_York"), mustZone(t, "Europe/London"), mustZone(t, "America/Santiago")
	tests := []struct {
		name      string
		loc       *time.Location
		period    Period
		weekStart time.Weekday
		at        string // RFC 3339
		start     string // the window holding at, RFC 3339
		length    time.Duration
	}{
		{"New York spring forward: 23 hours", ny, Day, 0, "2026-03-08T12:00:00-04:00", "2026-03-08T00:00:00-05:00", 23 * time.Hour},
		{"New York fall back: 25 hours", ny, Day, 0, "2026-11-01T12:00:00-05:00", "2026-11-01T00:00:00-04:00", 25 * time.Hour},
		{"New York in the repeated hour", ny, Day, 0, "2026-11-01T01:30:00-05:00", "2026-11-01T00:00:00-04:00", 25 * time.Hour},
		{"New York ordinary day", ny, Day, 0, "2026-11-02T23:59:59-05:00", "2026-11-02T00:00:00-05:00", 24 * time.Hour},
		{"London spring forward", london, Day, 0, "2026-03-29T03:00:00+01:00", "2026-03-29T00:00:00Z", 23 * time.Hour},
		{"London fall back", london, Day, 0, "2026-10-25T01:30:00Z", "2026-10-25T00:00:00+01:00", 25 * time.Hour},
		{"week from Monday, on a Sunday", london, Week, time.Monday, "2026-11-29T22:00:00Z", "2026-11-23T00:00:00Z", 7 * 24 * time.Hour},
		{"week from Sunday, on a Sunday", london, Week, time.Sunday, "2026-11-29T22:00:00Z", "2026-11-29T00:00:00Z", 7 * 24 * time.Hour},
		{"week from Saturday over the fall-back", ny, Week, time.Saturday, "2026-11-02T09:00:00-05:00", "2026-10-31T00:00:00-04:00", 7*24*time.Hour + time.Hour},
		{"week from Monday over the year's end", ny, Week, time.Monday, "2027-01-01T09:00:00-05:00", "2026-12-28T00:00:00-05:00", 7 * 24 * time.Hour},
		{"month of 31 days, at its last moment", ny, Month, 0, "2026-01-31T23:59:59-05:00", "2026-01-01T00:00:00-05:00", 31 * 24 * time.Hour},
		{"February of a leap year", london, Month, 0, "2028-02-29T12:00:00Z", "2028-02-01T00:00:00Z", 29 * 24 * time.Hour},
		{"March in New York: 31 days less the skipped hour", ny, Month, 0, "2026-03-31T12:00:00-04:00", "2026-03-01T00:00:00-05:00", 31*24*time.Hour - time.Hour},
		{"Santiago skips midnight: the day starts at 01:00", santiago, Day, 0, "2026-09-06T12:00:00-03:00", "2026-09-06T01:00:00-03:00", 23 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, _ := time.Parse(time.RFC3339, tt.at)
			want, _ := time.Parse(time.RFC3339, tt.start)
			c := mustCalendar(t, 1, tt.period, tt.weekStart)
			bs := c.Bounds(tt.loc, at)
			i := 0
			for i+1 < len(bs) && !bs[i+1].After(at) {
				i++
			}
			if !bs[i].Equal(want) {
				t.Errorf("window of %s starts %s, want %s", tt.at, bs[i].In(tt.loc), want.In(tt.loc))
			}
			if got := bs[i+1].Sub(bs[i]); got != tt.length {
				t.Errorf("window of %s lasts %s, want %s", tt.at, got, tt.length)
			}
			if i != calendarBehind || len(bs) != calendarBehind+2+tt.period.ahead() {
				t.Errorf("%d bounds, now's window at %d: want %d and %d", len(bs), i, calendarBehind+2+tt.period.ahead(), calendarBehind)
			}
			for j := 1; j < len(bs); j++ {
				if h, m, s := bs[j].In(tt.loc).Clock(); tt.loc != santiago && (h != 0 || m != 0 || s != 0) {
					t.Errorf("bound %d is %s: not a midnight", j, bs[j].In(tt.loc))
				}
			}
		})
	}
}

func TestQuietRangeParse(t *testing.T) {
	good := map[string]string{
		"21:00-08:00":         "21:00-08:00",
		"sun 00:00-24:00":     "sun 00:00-24:00",
		"sat,sun 10:00-12:30": "sun,sat 10:00-12:30",
		"mon-fri 18:00-09:00": "mon,tue,wed,thu,fri 18:00-09:00",
		"fri-mon 22:00-07:00": "sun,mon,fri,sat 22:00-07:00",
		" Sun  00:00-24:00":   "sun 00:00-24:00",
		"12:00-12:01":         "12:00-12:01",
	}
	for in, want := range good {
		r, err := ParseQuietRange(in)
		if err != nil {
			t.Errorf("ParseQuietRange(%q): %v", in, err)
		} else if r.String() != want {
			t.Errorf("ParseQuietRange(%q) = %s, want %s", in, r, want)
		}
	}
	bad := map[string]string{
		"21:00":              `not a range of local times like 21:00-08:00 (got "21:00")`,
		"08:00-08:00":        `"08:00-08:00" is empty or the whole of every day`,
		"00:00-24:00":        `"00:00-24:00" is empty or the whole of every day`,
		"sunday 09:00-10:00": `days "sunday": weekdays are sun, mon, tue, wed, thu, fri, sat (a list: sat,sun; a range: mon-fri)`,
		"24:00-08:00":        `"24:00" is not a time of day from 00:00 to 23:59 (24:00 as an end)`,
		"9:00-10:0":          `"10:0" is not a time of day from 00:00 to 23:59 (24:00 as an end)`,
		"21:60-08:00":        `"21:60" is not a time of day from 00:00 to 23:59 (24:00 as an end)`,
	}
	for in, want := range bad {
		if _, err := ParseQuietRange(in); err == nil || err.Error() != want {
			t.Errorf("ParseQuietRange(%q): got %v, want %s", in, err, want)
		}
	}
}

func mustQuietHours(t *testing.T, ranges ...string) *QuietHours {
	t.Helper()
	var rs []QuietRange
	for _, s := range ranges {
		r, err := ParseQuietRange(s)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	q, err := NewQuietHours("quiet", rs...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestQuietSpans checks quiet spans in local time across daylight-saving
// changes and weekdays: a night is 10 or 12 hours of absolute time when the
// clock changes in it.
func TestQuietSpans(t *testing.T) {
	ny, london := mustZone(t, "America/New_York"), mustZone(t, "Europe/London")
	tests := []struct {
		name   string
		loc    *time.Location
		ranges []string
		at     string // a moment in the span
		from   string
		to     string
	}{
		{"New York night over spring forward", ny, []string{"21:00-08:00"}, "2026-03-08T03:30:00-04:00", "2026-03-07T21:00:00-05:00", "2026-03-08T08:00:00-04:00"},
		{"New York night over fall back", ny, []string{"21:00-08:00"}, "2026-11-01T01:30:00-05:00", "2026-10-31T21:00:00-04:00", "2026-11-01T08:00:00-05:00"},
		{"London night over fall back", london, []string{"22:00-07:00"}, "2026-10-25T01:30:00Z", "2026-10-24T22:00:00+01:00", "2026-10-25T07:00:00Z"},
		{"a start in the skipped hour is the jump", ny, []string{"02:30-04:00"}, "2026-03-08T03:45:00-04:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"},
		{"an end in the skipped hour is the jump", ny, []string{"01:00-02:30"}, "2026-03-08T01:45:00-05:00", "2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"},
		{"a start in the repeated hour is its first", ny, []string{"01:30-03:00"}, "2026-11-01T01:45:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T03:00:00-05:00"},
		{"Sunday and the nights around it merge", london, []string{"21:00-08:00", "sun 00:00-24:00"}, "2026-11-29T12:00:00Z", "2026-11-28T21:00:00Z", "2026-11-30T08:00:00Z"},
		{"weekday evenings and weekends: Friday's evening runs to Monday's midnight", london, []string{"mon-fri 18:00-09:00", "sat,sun 00:00-24:00"}, "2026-11-28T12:00:00Z", "2026-11-27T18:00:00Z", "2026-11-30T00:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, _ := time.Parse(time.RFC3339, tt.at)
			from, _ := time.Parse(time.RFC3339, tt.from)
			to, _ := time.Parse(time.RFC3339, tt.to)
			r := mustQuietHours(t, tt.ranges...).In(tt.loc, at)
			if r.from.After(at) || !r.until.After(at.Add(8*24*time.Hour)) {
				t.Errorf("cover %s to %s: does not hold %s and a week after", r.from, r.until, at)
			}
			var got *Span
			for i, s := range r.Spans() {
				if i > 0 && !s.From.After(r.spans[i-1].To) {
					t.Errorf("span %d (%s) touches the one before (to %s)", i, s.From, r.spans[i-1].To)
				}
				if !at.Before(s.From) && at.Before(s.To) {
					got = &s
				}
			}
			if got == nil {
				t.Fatalf("no span holds %s: %v", at, r.Spans())
			}
			if !got.From.Equal(from) || !got.To.Equal(to) {
				t.Errorf("span %s to %s, want %s to %s", got.From.In(tt.loc), got.To.In(tt.loc), from.In(tt.loc), to.In(tt.loc))
			}
		})
	}
}

func TestQuietHoursInvalid(t *testing.T) {
	r := func(s string) QuietRange {
		q, err := ParseQuietRange(s)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	if _, err := NewQuietHours("q", r("12:00-08:00"), r("07:00-13:00")); err == nil || err.Error() != "throttle: quiet hours q (12:00-08:00, 07:00-13:00): cover the whole week: invalid rule" {
		t.Errorf("whole week: got %v", err)
	}
	if _, err := NewQuietHours("q"); err == nil {
		t.Error("no range: no error")
	}
	if _, err := NewQuietHours("q", r("mon-sun 00:00-24:00")); err == nil {
		t.Error("every day of the week, all day: no error")
	}
	if _, err := NewQuietHours("q", r("mon-sat 00:00-24:00")); err != nil {
		t.Errorf("all but Sunday: %v", err)
	}
}
