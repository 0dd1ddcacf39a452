package schedule

import (
	"testing"
	"time"
)

// TestParse checks the ticks of each kind of schedule.
func TestParse(t *testing.T) {
	utc := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name, cron, tz string
		after          string
		want           []string // the next ticks, in UTC
	}{
		{"five fields", "0 9 * * MON", "", "2024-06-03T09:00:00Z",
			[]string{"2024-06-10T09:00:00Z", "2024-06-17T09:00:00Z"}},
		{"seconds field", "*/20 * * * * *", "", "2024-06-03T09:00:05.5Z",
			[]string{"2024-06-03T09:00:20Z", "2024-06-03T09:00:40Z", "2024-06-03T09:01:00Z"}},
		{"time zone", "0 9 * * *", "Europe/Paris", "2024-06-03T00:00:00Z",
			[]string{"2024-06-03T07:00:00Z", "2024-06-04T07:00:00Z"}},
		// 01:30 happens twice that night: once is enough.
		{"clocks go back", "30 1 * * *", "America/New_York", "2024-11-02T12:00:00Z",
			[]string{"2024-11-03T05:30:00Z", "2024-11-04T06:30:00Z"}},
		{"clocks go back, every minute", "*/30 1 * * *", "America/New_York", "2024-11-03T04:45:00Z",
			[]string{"2024-11-03T05:00:00Z", "2024-11-03T05:30:00Z", "2024-11-04T06:00:00Z"}},
		// 02:30 does not exist that night: robfig/cron skips it.
		{"clocks go forward", "30 2 * * *", "America/New_York", "2024-03-09T12:00:00Z",
			[]string{"2024-03-11T06:30:00Z"}},
		{"descriptor", "@daily", "Asia/Tokyo", "2024-06-03T00:00:00Z",
			[]string{"2024-06-03T15:00:00Z", "2024-06-04T15:00:00Z"}},
		// @every is aligned on the epoch, so a worker started at 09:03:07
		// agrees with one started at 09:01:00.
		{"every aligned", "@every 10m", "", "2024-06-03T09:03:07Z",
			[]string{"2024-06-03T09:10:00Z", "2024-06-03T09:20:00Z"}},
		{"every on a tick", "@every 2s", "", "2024-06-03T09:00:02Z",
			[]string{"2024-06-03T09:00:04Z", "2024-06-03T09:00:06Z"}},
		{"every ignores the zone", "@every 1h", "Asia/Kolkata", "2024-06-03T09:03:07Z",
			[]string{"2024-06-03T10:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			loc, err := Zone(tt.tz)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Parse(tt.cron, loc)
			if err != nil {
				t.Fatal(err)
			}
			at := utc(tt.after)
			for i, w := range tt.want {
				at = s.Next(at)
				if !at.Equal(utc(w)) {
					t.Fatalf("tick %d = %s, want %s", i, at.UTC().Format(time.RFC3339), w)
				}
			}
		})
	}
}
