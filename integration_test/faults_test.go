//go:build integration

package integration_test

// Fault tests, and the run-and-check helpers they share with
// cluster_test.go: notifications enqueued by the enqueue binary, worker
// processes delivering them to the recording webhook, and, once the queue
// has settled, the same invariants as TestPipeline (every notification
// accounted for, no recipient over its windows, the provider never over its
// bucket), with the duplicate sends counted and reported.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// faultNote is one notification of a fault test's run.
type faultNote struct {
	id, recipient, template string
	sendBy                  *time.Time
}

// quotaWindow is one window of the fleet's policy.
type quotaWindow struct {
	limit int
	per   time.Duration
}

// enqueueNotes writes recipients × per notifications (idempotency keys
// <tag>-r<i>-<k>) to a JSONL file and puts them on the queue with the
// enqueue binary. Notification k >= deadlineFrom (when deadlineFrom > 0)
// must be sent by start + deadlineBase + k seconds. It returns them by task ID.
func (f *fleet) enqueueNotes(tag string, recipients, per, deadlineFrom int, deadlineBase time.Duration) map[string]faultNote {
	f.t.Helper()
	start := time.Now().Truncate(time.Second)
	notes := map[string]faultNote{}
	var lines []jsonlLine
	for k := range per { // recipient-interleaved: every recipient has work from the start
		for r := range recipients {
			l := jsonlLine{
				Recipient:      fmt.Sprintf("%s%03d@example.com", tag, r),
				Template:       "news",
				Data:           map[string]string{"k": fmt.Sprint(k)},
				IdempotencyKey: fmt.Sprintf("%s-r%03d-%d", tag, r, k),
			}
			n := faultNote{id: message.TaskID(l.IdempotencyKey), recipient: l.Recipient, template: l.Template}
			if deadlineFrom > 0 && k >= deadlineFrom {
				by := start.Add(deadlineBase + time.Duration(k)*time.Second)
				l.SendBy, n.sendBy = by.UTC().Format(time.RFC3339), &by
			}
			notes[n.id] = n
			lines = append(lines, l)
		}
	}
	f.enqueueFile(tag, lines)
	return notes
}

// enqueueFile writes lines to the JSONL file <tag>.jsonl and puts them on
// the queue with the enqueue binary, which must enqueue every one.
func (f *fleet) enqueueFile(tag string, lines []jsonlLine) {
	f.t.Helper()
	var b strings.Builder
	for _, l := range lines {
		js, err := json.Marshal(l)
		if err != nil {
			f.t.Fatal(err)
		}
		b.Write(js)
		b.WriteByte('\n')
	}
	file := filepath.Join(f.dir, tag+".jsonl")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		f.t.Fatal(err)
	}
	bin := buildBinary(f.t, "enqueue")
	_, stderr, code := runCommand(f.t, f.dir, nil, bin, "-config", f.writeConfig("enqueue", ""), "-file", file)
	want := fmt.Sprintf("enqueued %d, duplicates 0, rejected 0 (%d lines)", len(lines), len(lines))
	if code != 0 || strings.TrimRight(stderr, "\n") != want {
		f.t.Fatalf("enqueue -file: exit %d, stderr:\n%s\nwant exit 0 and only the summary %q", code, stderr, want)
	}
}

// waitAllEnded waits until every one of the notes was sent or archived and
// nothing is pending, active, scheduled or waiting for a retry.
func (f *fleet) waitAllEnded(timeout time.Duration, notes map[string]faultNote) asynq.QueueInfo {
	f.t.Helper()
	return f.waitSettled(timeout, func(q asynq.QueueInfo) bool {
		sent := 0
		for id := range f.hook.delivered() {
			if _, ok := notes[id]; ok {
				sent++
			}
		}
		return sent+q.Archived >= len(notes)
	})
}

// runCounts is what checkRun found.
type runCounts struct {
	sent, expired, archived int
	dupTasks, dupSends      int      // tasks the webhook accepted more than once, and the extra sends
	dups                    []string // their IDs
	noToken                 []string // sent with no ledger entry, where a master was lost (fleet.masterLost)
	requests                int      // webhook requests in all
}

func (c runCounts) String() string {
	return fmt.Sprintf("enqueued %d = sent %d + expired %d + archived (other) %d; webhook requests %d; sent twice: %d tasks (%d extra sends)",
		c.sent+c.expired+c.archived, c.sent, c.expired, c.archived, c.requests, c.dupTasks, c.dupSends)
}

// checkRun checks a settled run of notes against the fleet's policy
// (windows) and provider bucket, as TestPipeline does:
//   - every notification ended exactly one way: sent (accepted by the
//     webhook) or expired (archived, with "expired: "), never both; one
//     with no deadline was sent; no other archive reason, no unknown task;
//   - no job sent without holding a provider token, before its granted
//     moment or after its send-by;
//   - no recipient over a window and the provider never over its bucket:
//     exactly on the granted moments (the bucket ledger, Redis time) and on
//     the first arrivals within skewTolerance (fleet.arrivalTolerance).
//
// A task accepted more than once is an error unless allowDup; either way
// it is counted. Only first arrivals enter the limit checks: a redelivered
// task is re-admitted idempotently and takes nothing twice.
func checkRun(t *testing.T, f *fleet, notes map[string]faultNote, windows []quotaWindow, allowDup bool) runCounts {
	t.Helper()
	var c runCounts
	arrivals := f.hook.snapshot()
	c.requests = len(arrivals)
	delivered := f.hook.delivered()
	archived := f.archived()
	for id := range delivered {
		if _, ok := notes[id]; !ok {
			t.Errorf("the webhook got task %s, which was never enqueued", id)
		}
	}
	for id, n := range notes {
		info, isArchived := archived[id]
		reason := ""
		if isArchived {
			reason = info.LastErr
		}
		switch {
		case delivered[id] >= 1 && !isArchived:
			c.sent++
			if delivered[id] > 1 {
				c.dupTasks++
				c.dupSends += delivered[id] - 1
				c.dups = append(c.dups, id)
				if !allowDup {
					t.Errorf("task %s (%s) was accepted by the webhook %d times", id, n.recipient, delivered[id])
				}
			}
		case delivered[id] == 0 && isArchived && strings.HasPrefix(reason, "expired: "):
			c.expired++
			if n.sendBy == nil {
				t.Errorf("task %s for %s has no deadline, yet expired: %s", id, n.recipient, reason)
			}
		case isArchived:
			c.archived++
			t.Errorf("task %s (%s): archived (%q), delivered %d times: want sent or expired", id, n.recipient, reason, delivered[id])
		default:
			t.Errorf("task %s (%s): delivered %d times and not archived: the job was lost", id, n.recipient, delivered[id])
		}
	}
	for id, info := range archived {
		if _, ok := notes[id]; !ok {
			t.Errorf("task %s archived (%q), never enqueued as a notification", id, info.LastErr)
		}
	}
	if c.sent+c.expired+c.archived != len(notes) || c.sent == 0 {
		t.Errorf("%s; want the %d enqueued, some sent", c, len(notes))
	}

	// The limits, on the granted moments (exact) and on first arrivals. A
	// task sent twice (a worker killed while the provider had its request)
	// holds the take of its last send: that arrival is checked against it.
	ledger, entries := f.ledger(), f.quotaMoments()
	last := map[string]time.Time{}
	for _, a := range arrivals {
		if a.Status >= 200 && a.Status < 300 {
			last[a.Key] = a.At
		}
	}
	grantedBy, arrivedBy := map[string][]time.Time{}, map[string][]time.Time{}
	var granted, arrived []time.Time
	var skews []time.Duration
	first := map[string]bool{}
	for _, a := range arrivals {
		if first[a.Key] || a.Status < 200 || a.Status >= 300 {
			continue
		}
		first[a.Key] = true
		n, ok := notes[a.Key]
		if !ok {
			continue
		}
		g, ok := ledger[a.Key]
		if !ok {
			if f.masterLost {
				c.noToken = append(c.noToken, a.Key) // the caller bounds them
				continue
			}
			t.Errorf("task %s reached the webhook without holding a provider token", a.Key)
			continue
		}
		if l := last[a.Key]; l.Before(g.Add(-clockSlop)) {
			t.Errorf("task %s arrived %s before the moment it was granted", a.Key, g.Sub(l))
		}
		if n.sendBy != nil && (g.After(*n.sendBy) || a.At.After(n.sendBy.Add(skewTolerance))) {
			t.Errorf("task %s granted at %s, arrived at %s, after its send-by %s", a.Key,
				g.Format(time.StampMilli), a.At.Format(time.StampMilli), n.sendBy.Format(time.StampMilli))
		}
		skews = append(skews, a.At.Sub(g))
		granted, arrived = append(granted, g), append(arrived, a.At)
		grantedBy[n.recipient] = append(grantedBy[n.recipient], entryOr(entries, a.Key, g))
		arrivedBy[n.recipient] = append(arrivedBy[n.recipient], a.At)
	}
	for _, w := range windows {
		asGranted := checkWindows(t, "granted moments", grantedBy, w.limit, w.per, grantResolution)
		asArrived := checkWindows(t, "arrivals", arrivedBy, w.limit, w.per, f.arrivalTolerance())
		t.Logf("policy %d per %s: closest %d+1 messages to one recipient: %s apart as granted, %s as arrived",
			w.limit, w.per, w.limit, asGranted, asArrived)
	}
	// No allowance for refunds: a release refunds a bucket token only when
	// no later holding assumed it gone (bucket_undo). bucketSlack allows for
	// a known bug where a test says so, and the log says when it showed.
	extra := func(from, to time.Time) float64 { return 0 }
	if f.bucketExtra != nil {
		extra = f.bucketExtra
		for what, times := range map[string][]time.Time{"granted moments": granted, "arrivals": arrived} {
			ts := slices.Clone(times)
			slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
			tol := 0.0
			if what == "arrivals" {
				tol = f.cfg.Rate * skewTolerance.Seconds()
			}
			if raw, from, n, span := bucketExcess(ts, f.cfg.Rate, f.cfg.Burst, nil); raw > tol+0.01 {
				t.Logf("KNOWN BUG showed (%s): %d %s within %s from %s, %.2f over the bucket",
					f.extraWhy, n, what, span, from.Format("15:04:05.000"), raw-tol)
			}
		}
	}
	eg := checkBucket(t, "granted moments", granted, f.cfg.Rate, f.cfg.Burst, grantResolution, extra)
	ea := checkBucket(t, "arrivals", arrived, f.cfg.Rate, f.cfg.Burst, f.arrivalTolerance(), extra)
	t.Logf("provider: most requests in any 1 s %d (bucket allows %g), excess over burst+rate·T: granted %.2f, arrived %.2f; arrival-granted skew: %s",
		maxRate(arrived, time.Second), float64(f.cfg.Burst)+f.cfg.Rate, eg, ea, skewSummary(skews))
	sort.Strings(c.dups)
	return c
}

// sentMarkers returns how many of ids have a sent marker (jobs.SentMarks)
// in Redis.
func (f *fleet) sentMarkers(ids []string) int {
	f.t.Helper()
	lim, err := throttle.New(f.rdb, throttle.Options{Prefix: fleetPrefix})
	if err != nil {
		f.t.Fatal(err)
	}
	marks := jobs.NewSentMarks(lim)
	n := 0
	for _, id := range ids {
		_, ok, err := marks.SentAt(context.Background(), id)
		if err != nil {
			f.t.Fatal(err)
		}
		if ok {
			n++
		}
	}
	return n
}

// TestKill9WorkerMidSend: two workers deliver 90 notifications; the
// webhook holds the answers to worker w1's requests after its first few,
// and once w1 has jobs waiting for their answer it is killed with SIGKILL,
// and the held requests are answered (the provider did accept them: their
// answers are lost with the worker). w2 takes w1 for dead after
// worker.dead_after and runs w1's active jobs again (package recovery).
// The re-runs are admitted again (idempotently: not blocked by their own
// quota entries, nothing counted twice) and sent, and the run then meets
// every invariant of checkRun.
//
// What it reports: the jobs re-run and the ones sent twice. A job the
// provider had accepted but whose answer the worker never got is sent twice
// with or without sent markers (jobs.SentMarks): the marker is written on
// the answer. Markers prevent the duplicate only when the worker died after
// the answer and before asynq recorded the task done.
func TestKill9WorkerMidSend(t *testing.T) {
	const (
		recipients = 30
		per        = 3
		holdAfter  = 6 // w1's first requests are answered at once, the next held
		inFlight   = 4 // kill w1 once this many of its requests are held
	)
	cfg := fleetConfig{
		Concurrency:     inFlight,
		ShutdownTimeout: 5 * time.Second,
		InlineWait:      time.Second,
		Jitter:          200 * time.Millisecond,
		Policy:          "[{limit: 1, per: 1s}, {limit: 2, per: 4s}]",
		Rate:            20,
		Burst:           5,
	}
	windows := []quotaWindow{{1, time.Second}, {2, 4 * time.Second}}
	release := make(chan struct{})
	fromW1 := 0
	f := newFleet(t, cfg, func(a arrival, seq int) hookAnswer {
		if a.Worker != "w1" {
			return hookAnswer{}
		}
		if fromW1++; fromW1 <= holdAfter {
			return hookAnswer{}
		}
		return hookAnswer{Hold: release}
	})
	notes := f.enqueueNotes("kill", recipients, per, 0, 0)
	w1 := f.startWorker("w1")
	held := func() []arrival {
		var hs []arrival
		for _, a := range f.hook.snapshot() {
			if a.Worker == "w1" && a.Status == 0 {
				hs = append(hs, a)
			}
		}
		return hs
	}
	waitFor(t, fmt.Sprintf("w1 to have %d requests held", inFlight), func() bool { return len(held()) >= inFlight })
	w2 := f.startWorker("w2")
	waitFor(t, "w2 to send too", func() bool {
		return slices.ContainsFunc(f.hook.snapshot(), func(a arrival) bool { return a.Worker == "w2" })
	})
	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !w1.wait(10 * time.Second) {
		t.Fatal("w1 still running 10 s after SIGKILL")
	}
	killed := time.Now()
	inflight := held()
	close(release) // the provider accepts them; w1 never hears it
	orphans, err := f.insp.ListActiveTasks(fleetQueue, asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	// The active tasks now are w1's (w2's finish within a second at most;
	// one still active below is dropped by the lease check further on, or
	// completes as any of w1's must).
	time.Sleep(1500 * time.Millisecond)
	var ids []string
	for _, ti := range orphans {
		if still, err := f.insp.GetTaskInfo(fleetQueue, ti.ID); err == nil && still.State == asynq.TaskStateActive {
			ids = append(ids, ti.ID)
		}
	}
	if len(ids) == 0 {
		t.Fatalf("no task left active by the killed worker")
	}
	t.Logf("killed w1 with %d requests waiting for the provider's answer; %d tasks left active", len(inflight), len(ids))
	heldIDs := map[string]bool{}
	for _, a := range inflight {
		heldIDs[a.Key] = true
	}

	// w2's reaper hands w1's tasks back to the queue once w1 has been
	// silent for dead_after (package recovery), and w2 runs them.
	f.waitAllEnded(60*time.Second, notes)
	m := f.metricsOf(w2)
	f.stop(w2)
	t.Logf("recovered and settled %s after the kill", time.Since(killed).Round(time.Second))

	c := checkRun(t, f, notes, windows, true)
	t.Logf("%s", c)
	// Every task w1 left active was handed over and run again to
	// completion (sent once more or completed) and none was blocked by its
	// own admission: the re-runs' admissions were repeats
	// (throttler_admitted_total counts them) and nothing is left deferred.
	for _, id := range ids {
		ti, err := f.insp.GetTaskInfo(fleetQueue, id)
		if err != nil {
			t.Errorf("task %s: %v", id, err)
			continue
		}
		if ti.State != asynq.TaskStateCompleted || ti.Retried != 0 {
			t.Errorf("task %s left active by w1: %s after %d retries (%q), want completed without a retry", id, ti.State, ti.Retried, ti.LastErr)
		}
	}
	redelivered := int(m[`throttler_recovered_tasks_total{queue="`+fleetQueue+`"}`])
	if redelivered != len(ids) {
		t.Errorf("w2 handed over %d tasks, want the %d w1 left active", redelivered, len(ids))
	}
	// A task whose send reached the provider before the kill and is sent
	// again is a duplicate; one that never reached it is not.
	dupHeld, dupOther := 0, 0
	for _, id := range c.dups {
		if heldIDs[id] {
			dupHeld++
		} else {
			dupOther++
		}
		if !slices.Contains(ids, id) {
			t.Errorf("task %s sent twice, yet w1 did not leave it active", id)
		}
	}
	// The quota counted each task once: the recipient's set holds it once
	// (members are unique), and the window checks above passed on the
	// granted moments; the re-run's send is the only extra.
	markers := f.sentMarkers(slices.Collect(func(yield func(string) bool) {
		for id := range notes {
			if !yield(id) {
				return
			}
		}
	}))
	mode := "OFF (cmd/worker sets no jobs.Throttle.Sent)"
	if markers > 0 {
		mode = fmt.Sprintf("on (%d markers)", markers)
	}
	t.Logf("kill -9: %d tasks re-run, %d handed over; sent twice: %d (%d were waiting for the provider's answer at the kill, %d answered before it); sent markers %s; duplicates suppressed by markers (metrics): %g",
		len(ids), redelivered, c.dupTasks, dupHeld, dupOther, mode, m[`throttler_duplicates_skipped_total{provider="hook"}`])
	if dupHeld > len(inflight) {
		t.Errorf("%d held tasks sent twice, only %d were held", dupHeld, len(inflight))
	}
	if markers > 0 && dupOther > 0 {
		t.Errorf("%d tasks answered before the kill and marked sent were sent again", dupOther)
	}
}
