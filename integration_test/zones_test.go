//go:build integration

package integration_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
)

// shiftedZone writes a time zone "Test/Shifted" of a fixed UTC offset into a
// zoneinfo directory, sets ZONEINFO to it for the workers the test starts
// (the test process itself never loads the zone: Go reads ZONEINFO once per
// process), and returns the offset. The offset is chosen so that the local
// clock shows hh:mm:(60-ahead) now, a local minute boundary ahead seconds
// from now: what places a quiet-hours end or a calendar day's start near
// Redis time without waiting for it. If midnight, the local clock shows
// 23:59 then.
func shiftedZone(t *testing.T, ahead time.Duration, midnight bool) (time.Duration, time.Time) {
	t.Helper()
	now := time.Now().UTC()
	boundary := now.Add(ahead).Truncate(time.Second).Add(time.Second) // a whole second, ahead from now
	sinceMidnight := boundary.Sub(boundary.Truncate(24 * time.Hour))
	off := -sinceMidnight // local midnight at boundary
	if !midnight {
		off = -(sinceMidnight % time.Minute) // a local minute at boundary
	}
	// TZif version 1: no transitions, one type (the offset), "TST".
	var b []byte
	b = append(b, "TZif"...)
	b = append(b, make([]byte, 16)...)
	for _, n := range []uint32{0, 0, 0, 0, 1, 4} { // isutcnt isstdcnt leapcnt timecnt typecnt charcnt
		b = binary.BigEndian.AppendUint32(b, n)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(int32(off/time.Second)))
	b = append(b, 0, 0) // isdst, abbreviation index
	b = append(b, "TST\x00"...)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "Test"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Test", "Shifted"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	loc, err := time.LoadLocationFromTZData("Test/Shifted", b)
	if err != nil {
		t.Fatal(err)
	}
	if midnight && boundary.In(loc).Format("15:04:05") != "00:00:00" || !midnight && boundary.In(loc).Second() != 0 {
		t.Fatalf("the zone puts %s at %s", boundary, boundary.In(loc))
	}
	t.Setenv("ZONEINFO", dir)
	return off, boundary
}

// TestQuietHoursThroughTheWorker: quiet hours in the recipient's zone that
// end seconds from now hold every message until they end; with booking the
// messages held for the end go one provider slot apart, each booked once.
func TestQuietHoursThroughTheWorker(t *testing.T) {
	off, end := shiftedZone(t, 12*time.Second, false)
	local := func(t time.Time) string { return t.UTC().Add(off).Format("15:04") }
	quiet := fmt.Sprintf("%s-%s", local(end.Add(-time.Hour)), local(end))
	cfg := fleetConfig{
		Concurrency: 8, ShutdownTimeout: 5 * time.Second, InlineWait: 2500 * time.Millisecond, Jitter: 0,
		Policy: fmt.Sprintf("{windows: [{limit: 5, per: 1h}], quiet: [%q], timezone: Test/Shifted}", quiet),
		Rate:   1, Burst: 1, Book: true,
	}
	f := newFleet(t, cfg, func(arrival, int) hookAnswer { return hookAnswer{} })
	w := f.startWorker("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	for i := range 6 {
		f.enqueue(client, fmt.Sprint("q-", i), message.Notification{Recipient: fmt.Sprintf("r%d@example.com", i), Template: "news"})
	}
	// All six wait for the end of quiet hours, booked one slot (1 s) apart:
	// asynq wakes them at six different seconds, not all at once.
	for q := f.queueState(); q.Retry < 6; q = f.queueState() {
		if time.Now().After(end.Add(-time.Second)) {
			t.Fatalf("%d of 6 booked a second before quiet hours end", q.Retry)
		}
		time.Sleep(50 * time.Millisecond)
	}
	held, err := f.insp.ListRetryTasks(fleetQueue)
	if err != nil {
		t.Fatal(err)
	}
	wakes := map[int64]bool{}
	for _, ti := range held {
		wakes[ti.NextProcessAt.Unix()] = true
	}
	if len(wakes) != 6 {
		t.Errorf("the six held messages wake at %d different seconds, want 6 (one per slot)", len(wakes))
	}
	f.waitSettled(60*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 6 })
	for _, a := range f.hook.snapshot() {
		if a.At.Before(end) {
			t.Errorf("%s arrived at %s, in quiet hours (until %s)", a.Key, a.At.Format(time.StampMicro), end.Format(time.StampMicro))
		}
	}
	// Each goes at its own moment: none loses it and books again. (How
	// many count as claims is the bucket's business: a job whose slot the
	// ledger already holds goes the plain way.)
	m := f.metricsOf(w)
	t.Logf("quiet until %s (%s local): bookings made %v, rebooked %v, claimed %v", end.Format(time.StampMilli), quiet,
		m[`throttler_bookings_total{event="made"}`], m[`throttler_bookings_total{event="rebooked"}`], m[`throttler_bookings_total{event="claimed"}`])
	if again := m[`throttler_bookings_total{event="rebooked"}`]; again != 0 {
		t.Errorf("%v bookings made again; want none", again)
	}
}

// TestCalendarDayThroughTheWorker: a recipient's "1 per calendar day" in its
// zone: the first message goes, the second waits for local midnight,
// seconds from now; another recipient is not held.
func TestCalendarDayThroughTheWorker(t *testing.T) {
	_, midnight := shiftedZone(t, 8*time.Second, true)
	cfg := fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: 2500 * time.Millisecond, Jitter: 0,
		Policy: "{calendar: [{limit: 1, per: day}], timezone: Test/Shifted}",
		Rate:   100, Burst: 10, Book: true,
	}
	f := newFleet(t, cfg, func(arrival, int) hookAnswer { return hookAnswer{} })
	f.startWorker("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	first := f.enqueue(client, "day-1", message.Notification{Recipient: "alice@example.com", Template: "news"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 1 })
	second := f.enqueue(client, "day-2", message.Notification{Recipient: "alice@example.com", Template: "news"})
	other := f.enqueue(client, "day-bob", message.Notification{Recipient: "bob@example.com", Template: "news"})
	f.waitSettled(60*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 3 })
	at := map[string]time.Time{}
	for _, a := range f.hook.snapshot() {
		at[a.Key] = a.At
	}
	if !at[first].Before(midnight) || !at[other].Before(midnight) {
		t.Errorf("the day's first messages arrived at %s and %s, want before local midnight (%s)", at[first], at[other], midnight)
	}
	if at[second].Before(midnight) {
		t.Errorf("alice's second message of the day arrived at %s, before local midnight (%s)", at[second].Format(time.StampMicro), midnight.Format(time.StampMicro))
	}
}
