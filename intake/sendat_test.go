package intake

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestNextLocal: the next moment a zone's clock reads a time of day, on
// ordinary days and on the days clocks go forward (a time skipped goes at
// the first instant after the gap) and back (a time read twice goes at the
// first reading, or the second once the first has passed), in
// Europe/Paris and America/New_York.
func TestNextLocal(t *testing.T) {
	paris, newYork := mustZone(t, "Europe/Paris"), mustZone(t, "America/New_York")
	utc := func(y int, m time.Month, d, h, min int) time.Time { return time.Date(y, m, d, h, min, 0, 0, time.UTC) }
	cases := []struct {
		name  string
		loc   *time.Location
		clock string
		now   time.Time
		want  time.Time
	}{
		// Paris goes from 02:00 CET to 03:00 CEST on 2026-03-29 (01:00 UTC).
		{"Paris, spring forward: a time in the gap", paris, "02:30", utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 1, 0)},
		{"Paris, spring forward: the gap's start", paris, "02:00", utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 1, 0)},
		{"Paris, spring forward: the gap's end", paris, "03:00", utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 1, 0)},
		{"Paris, spring forward: just before the gap", paris, "01:59", utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 0, 59)},
		{"Paris, spring forward: the morning", paris, "09:00", utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 7, 0)},
		// Paris goes from 03:00 CEST back to 02:00 CET on 2026-10-25 (01:00 UTC).
		{"Paris, fall back: a time read twice", paris, "02:30", utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 0, 30)},
		{"Paris, fall back: the fold's start", paris, "02:00", utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 0, 0)},
		{"Paris, fall back: read once, after", paris, "03:00", utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 2, 0)},
		{"Paris, fall back: between the two readings", paris, "02:30", utc(2026, 10, 25, 1, 0), utc(2026, 10, 25, 1, 30)},
		{"Paris, fall back: after both readings", paris, "02:30", utc(2026, 10, 25, 1, 30), utc(2026, 10, 26, 1, 30)},
		// New York goes from 02:00 EST to 03:00 EDT on 2026-03-08 (07:00 UTC)
		// and from 02:00 EDT back to 01:00 EST on 2026-11-01 (06:00 UTC).
		{"New York, spring forward: a time in the gap", newYork, "02:30", utc(2026, 3, 7, 12, 0), utc(2026, 3, 8, 7, 0)},
		{"New York, spring forward: the morning", newYork, "09:00", utc(2026, 3, 7, 15, 0), utc(2026, 3, 8, 13, 0)},
		{"New York, fall back: a time read twice", newYork, "01:30", utc(2026, 10, 31, 12, 0), utc(2026, 11, 1, 5, 30)},
		{"New York, fall back: the morning", newYork, "09:00", utc(2026, 10, 31, 14, 0), utc(2026, 11, 1, 14, 0)},
		// Ordinary days.
		{"later today", paris, "18:00", utc(2026, 6, 1, 12, 0), utc(2026, 6, 1, 16, 0)},
		{"passed today: tomorrow", paris, "09:00", utc(2026, 6, 1, 12, 0), utc(2026, 6, 2, 7, 0)},
		{"now exactly: tomorrow", paris, "14:00", utc(2026, 6, 1, 12, 0), utc(2026, 6, 2, 12, 0)},
		{"with seconds", newYork, "23:59:59", utc(2026, 12, 31, 12, 0), time.Date(2027, 1, 1, 4, 59, 59, 0, time.UTC)},
		{"over a month's end", time.UTC, "00:00", utc(2026, 2, 28, 1, 0), utc(2026, 3, 1, 0, 0)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NextLocal(tc.clock, tc.loc, tc.now)
			if err != nil || !got.Equal(tc.want) {
				t.Errorf("NextLocal(%s, %s, %s) = %s (%s there), %v; want %s (%s there)", tc.clock, tc.loc, tc.now.Format(time.RFC3339),
					got.UTC().Format(time.RFC3339), got.Format("15:04:05 MST"), err, tc.want.Format(time.RFC3339), tc.want.In(tc.loc).Format("15:04:05 MST"))
			}
		})
	}
}

// TestNextLocalMalformed: a time of day is HH:MM or HH:MM:SS, two digits
// each, within a day.
func TestNextLocalMalformed(t *testing.T) {
	for _, clock := range []string{"", "9:00", "09:0", "0900", "09-00", "24:00", "09:60", "09:00:60", "09:00:0", "09:00 ", "9am", "09:00:00.5", "٠٩:٠٠"} {
		_, err := NextLocal(clock, time.UTC, time.Now())
		if want := fmt.Sprintf("must be a time of day HH:MM or HH:MM:SS such as 09:00 (got %s)", Quote(clock)); err == nil || err.Error() != want {
			t.Errorf("NextLocal(%q): %v, want %q", clock, err, want)
		}
	}
}

// TestScheduleRefused: a scheduled notification's bad moment is refused
// naming its field, whether it came as a JSONL line (the API, enqueue
// -file) or as an Entry (enqueue's flags), where flags can say it.
func TestScheduleRefused(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) *time.Time { t := now.Add(d).UTC().Truncate(time.Second); return &t }
	rfc := func(d time.Duration) string { return at(d).Format(time.RFC3339) }
	clock := now.Add(-time.Minute).UTC().Format("15:04") // its next reading is a day off
	cases := []struct {
		name, line string
		entry      *Entry // nil: only a line can say it
		field, msg string // msg: what the message starts with
	}{
		{"an instant in the past", `"send_at":"` + rfc(-2*time.Minute) + `"`, &Entry{SendAt: at(-2 * time.Minute)},
			"send_at", "send_at: " + rfc(-2*time.Minute) + " is in the past (more than 1m ago)"},
		{"an instant not RFC 3339", `"send_at":"tomorrow 9am"`, nil,
			"send_at", `send_at: must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got "tomorrow 9am")`},
		{"an instant not a string", `"send_at":1700000000`, nil, "send_at", "send_at: must be a string (got number)"},
		{"both forms", `"send_at":"` + rfc(time.Hour) + `","send_at_local":"09:00"`, &Entry{SendAt: at(time.Hour), SendAtLocal: "09:00"},
			"send_at_local", "send_at_local: given with send_at: give one moment"},
		{"a malformed time of day", `"send_at_local":"9am"`, &Entry{SendAtLocal: "9am"},
			"send_at_local", `send_at_local: must be a time of day HH:MM or HH:MM:SS such as 09:00 (got "9am")`},
		{"a time of day not a string", `"send_at_local":900`, nil, "send_at_local", "send_at_local: must be a string (got number)"},
		{"a time of day in an unknown zone", `"send_at_local":"09:00","tz":"Mars/Olympus"`, &Entry{SendAtLocal: "09:00", TZ: "Mars/Olympus"},
			"tz", `tz: unknown time zone "Mars/Olympus"`},
		{"an instant after the send-by", `"send_at":"` + rfc(2*time.Hour) + `","send_by":"` + rfc(time.Hour) + `"`, &Entry{SendAt: at(2 * time.Hour), SendBy: at(time.Hour)},
			"send_at", "send_at: " + rfc(2*time.Hour) + " is after send_by " + rfc(time.Hour) + ": it would only expire"},
		{"a time of day after the send-by", `"send_at_local":"` + clock + `","tz":"UTC","send_by":"` + rfc(time.Hour) + `"`, &Entry{SendAtLocal: clock, TZ: "UTC", SendBy: at(time.Hour)},
			"send_at_local", "send_at_local: " + clock + " ("},
	}
	c := testChecker(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				var e *Error
				if !errors.As(err, &e) || e.Field != tc.field || !strings.HasPrefix(err.Error(), tc.msg) {
					t.Errorf("%s: %v (%#v), want field %s and %q...", how, err, e, tc.field, tc.msg)
				}
			}
			e, err := ParseLine([]byte(`{"recipient":"a@example.com","template":"t",` + tc.line + `}`))
			if err == nil {
				_, err = c.Check(e, now)
			}
			check("the line", err)
			if tc.entry != nil {
				tc.entry.Recipient, tc.entry.Template = "a@example.com", "t"
				_, err = c.Check(*tc.entry, now)
				check("the entry", err)
			}
		})
	}
}

// TestScheduleTaken: a moment within the grace, an instant to come and a
// time of day (in the notification's zone, else its policy's) make the
// task's SendAt, rounded up to a whole second.
func TestScheduleTaken(t *testing.T) {
	c := testChecker(t)
	c.Config.Policies["evening"] = config.Policy{Windows: []throttle.Window{{Limit: 1, Per: time.Hour}}, OverCap: config.OverCapDefer, TimeZone: "America/New_York"}
	now := time.Date(2026, 12, 7, 10, 15, 30, 0, time.UTC)
	soon := now.Add(90*time.Minute + 300*time.Millisecond)
	lately := now.Add(-30 * time.Second)
	cases := []struct {
		name  string
		entry Entry
		want  time.Time
	}{
		{"an instant to come, rounded up", Entry{SendAt: &soon}, now.Add(90*time.Minute + time.Second)},
		{"an instant within the grace", Entry{SendAt: &lately}, lately},
		{"a time of day in its zone", Entry{SendAtLocal: "09:00", TZ: "Europe/Paris"}, time.Date(2026, 12, 8, 8, 0, 0, 0, time.UTC)},
		{"a time of day in its policy's zone", Entry{SendAtLocal: "09:00", Policy: "evening"}, time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)},
		{"a time of day, no zone: UTC", Entry{SendAtLocal: "10:15:31"}, time.Date(2026, 12, 7, 10, 15, 31, 0, time.UTC)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.entry.Recipient, tc.entry.Template = "a@example.com", "t"
			j, err := c.Check(tc.entry, now)
			if err != nil {
				t.Fatal(err)
			}
			if at := j.Notification.SendAt; at == nil || !at.Equal(tc.want) {
				t.Errorf("send_at %v, want %s", at, tc.want)
			}
		})
	}
}
