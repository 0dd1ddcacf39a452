package jobs

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// quietNow returns quiet hours that hold every moment from now for a
// little more than hold, in zone loc, whatever the time of day; and when
// they end. They are whole minutes of local time, so hold is rounded up.
func quietNow(t *testing.T, loc *time.Location, hold time.Duration) (*throttle.QuietHours, time.Time) {
	t.Helper()
	now := time.Now().In(loc)
	from := now.Add(-time.Hour).Truncate(time.Minute)
	to := now.Add(hold + time.Minute).Truncate(time.Minute)
	clock := func(t time.Time) string { return t.Format("15:04") }
	r, err := throttle.ParseQuietRange(clock(from) + "-" + clock(to))
	if err != nil {
		t.Fatal(err)
	}
	q, err := throttle.NewQuietHours("mkt", r)
	if err != nil {
		t.Fatal(err)
	}
	return q, to
}

// TestHandlerHoldsQuietHoursInTheRecipientsZone: the same message goes
// to a recipient whose zone is outside quiet hours and is held, not
// dropped, for one inside them, until they end in their zone (the end
// itself is the engine's: throttle's tests wait for it).
func TestHandlerHoldsQuietHoursInTheRecipientsZone(t *testing.T) {
	t.Parallel()
	for _, book := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "booking"}[book], func(t *testing.T) {
			t.Parallel()
			tokyo, _ := time.LoadLocation("Asia/Tokyo")
			quiet, end := quietNow(t, tokyo, time.Hour)
			q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 1000, 100)
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, book: book, inlineWait: 2500 * time.Millisecond,
				settings: PolicySettings{Quiet: quiet, Zone: tokyo, Drop: true}})
			// Honolulu's clock is 19 hours behind Tokyo's, 5 ahead on the
			// dial: outside the two hours of quiet.
			h.enqueue(t, "honolulu", message.Notification{Recipient: "alice", TZ: "Pacific/Honolulu"})
			h.await(t, "honolulu", "completed", state(asynq.TaskStateCompleted))
			h.enqueue(t, "tokyo", message.Notification{Recipient: "bob"}) // the policy's zone
			info := h.await(t, "tokyo", "held", state(asynq.TaskStateRetry))
			reason := "throttled by policy mkt (quiet "
			if book {
				reason = "booked for "
			}
			if !strings.HasPrefix(info.LastErr, reason) || !strings.Contains(info.LastErr, "policy mkt (quiet ") {
				t.Errorf("reason %q, want it to start %q and name the quiet hours", info.LastErr, reason)
			}
			if info.NextProcessAt.Before(end.Add(-2 * time.Second)) {
				t.Errorf("held until %s, before the quiet hours end (%s)", info.NextProcessAt, end)
			}
			if h.wasSent("tokyo") {
				t.Error("sent in quiet hours")
			}
		})
	}
}

// TestHandlerCalendarOnlyPolicy: a policy of calendar windows alone
// counts per local day; over it, a dropping policy drops.
func TestHandlerCalendarOnlyPolicy(t *testing.T) {
	t.Parallel()
	cal, _ := throttle.NewCalendar("mkt.day", 1, throttle.Day, time.Monday)
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{bucket: b, settings: PolicySettings{Calendars: []*throttle.Calendar{cal}, Drop: true}})
	h.enqueue(t, "first", message.Notification{Recipient: "alice", TZ: "Europe/London"})
	h.await(t, "first", "completed", state(asynq.TaskStateCompleted))
	h.enqueue(t, "second", message.Notification{Recipient: "alice", TZ: "Europe/London"})
	info := h.await(t, "second", "archived", state(asynq.TaskStateArchived))
	if want := "dropped: over policy mkt (1 per calendar day): skip retry for the task"; info.LastErr != want {
		t.Errorf("reason %q, want %q", info.LastErr, want)
	}
}

// TestZonesFollowAReload: the rules placed in a zone are made again when
// the policy's calendar windows, quiet hours or zone change (a reload), not
// only on the next local day.
func TestZonesFollowAReload(t *testing.T) {
	var z zones
	now := time.Now()
	day, _ := throttle.NewCalendar("mkt.day", 1, throttle.Day, time.Monday)
	week, _ := throttle.NewCalendar("mkt.week", 3, throttle.Week, time.Monday)
	before := PolicySettings{Calendars: []*throttle.Calendar{day}}
	after := PolicySettings{Calendars: []*throttle.Calendar{day, week}, Zone: time.UTC}
	names := func(p PolicySettings) []string {
		ts, err := z.takes(p, "mkt", "Europe/Paris", "alice", now)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, tk := range ts {
			s = append(s, tk.Rule.Name()+" "+tk.Subject)
		}
		return s
	}
	if got := strings.Join(names(before), ", "); got != "mkt.day alice" {
		t.Errorf("before: %s", got)
	}
	if got := strings.Join(names(after), ", "); got != "mkt.day alice, mkt.week alice" {
		t.Errorf("after the reload: %s, want both windows", got)
	}
}
