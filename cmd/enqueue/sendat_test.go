package main

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/message"
)

// scheduled returns the notification of task id in queue, failing the test
// unless asynq holds it until its send_at.
func (h *harness) scheduled(queue, id string) message.Notification {
	h.t.Helper()
	info, err := h.insp.GetTaskInfo(queue, id)
	if err != nil {
		h.t.Fatalf("task %s in queue %s: %v", id, queue, err)
	}
	n, err := message.Decode(info.Payload)
	if err != nil {
		h.t.Fatalf("task %s: payload %s: %v", id, info.Payload, err)
	}
	if info.State != asynq.TaskStateScheduled || n.SendAt == nil || !info.NextProcessAt.Equal(*n.SendAt) {
		h.t.Fatalf("task %s: state %v until %s, send_at %v; want scheduled until its send_at", id, info.State, info.NextProcessAt, n.SendAt)
	}
	return n
}

// within fails the test unless got is one of the moments from and to
// make (the same but across a tick of the clock).
func within(t *testing.T, what string, got *time.Time, from, to time.Time) {
	t.Helper()
	if got == nil || got.Before(from) || got.After(to) {
		t.Errorf("%s = %v, want from %s to %s", what, got, from, to)
	}
}

// TestOneSendAt: -send-at takes an RFC 3339 time or a duration from now,
// -send-at-local a time of day in the recipient's zone; either way the task
// waits in asynq's schedule for its moment.
func TestOneSendAt(t *testing.T) {
	h := newHarness(t)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	in := h.runArgs("-to", "a@example.com", "-template", "t", "-send-at", "90m")
	at := h.runArgs("-to", "b@example.com", "-template", "t", "-send-at", "2099-11-22T10:00:00.2+01:00")
	local := h.runArgs("-to", "c@example.com", "-template", "t", "-send-at-local", "09:00", "-tz", "Europe/Paris")
	after := time.Now()
	for _, out := range []outcome{in, at, local} {
		if out.code != 0 || !uuidLine.MatchString(out.stdout) || out.stderr != "" {
			t.Fatalf("enqueue = %d, stdout %q, stderr %q; want 0, a task ID, nothing", out.code, out.stdout, out.stderr)
		}
	}
	within(t, "-send-at 90m", h.scheduled("default", strings.TrimSpace(in.stdout)).SendAt,
		before.Add(90*time.Minute).Truncate(time.Second), after.Add(90*time.Minute+time.Second))
	n := h.scheduled("default", strings.TrimSpace(at.stdout))
	within(t, "-send-at 2099-11-22T10:00:00.2+01:00", n.SendAt, time.Date(2099, 11, 22, 9, 0, 1, 0, time.UTC), time.Date(2099, 11, 22, 9, 0, 1, 0, time.UTC))
	first, _ := intake.NextLocal("09:00", paris, before)
	last, _ := intake.NextLocal("09:00", paris, after)
	n = h.scheduled("default", strings.TrimSpace(local.stdout))
	within(t, "-send-at-local 09:00 -tz Europe/Paris", n.SendAt, first, last)
	if n.TZ != "Europe/Paris" {
		t.Errorf("tz %q, want Europe/Paris", n.TZ)
	}
	wantPending(t, h, map[string]int{}) // none before its moment
}

// TestOneScheduleRejected: a bad moment from the flags is refused, naming
// the field, exit status 1, nothing enqueued; a malformed -send-at is a
// usage error.
func TestOneScheduleRejected(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name string
		args []string
		want string // stderr's start
	}{
		{"both forms", []string{"-send-at", "1h", "-send-at-local", "09:00"},
			"enqueue: send_at_local: given with send_at: give one moment, an instant or a time of day\n"},
		{"a malformed time of day", []string{"-send-at-local", "9h"},
			`enqueue: send_at_local: must be a time of day HH:MM or HH:MM:SS such as 09:00 (got "9h")` + "\n"},
		{"an unknown zone", []string{"-send-at-local", "09:00", "-tz", "Europe/Atlantis"},
			`enqueue: tz: unknown time zone "Europe/Atlantis" (an IANA zone such as Europe/Paris)` + "\n"},
		{"a moment past", []string{"-send-at", "2001-09-09T01:46:40Z"},
			"enqueue: send_at: 2001-09-09T01:46:40Z is in the past (more than 1m ago)\n"},
		{"after the send-by", []string{"-send-at", "2h", "-send-by", "1h"}, "enqueue: send_at: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := h.runArgs(append([]string{"-to", "a@example.com", "-template", "t"}, tt.args...)...)
			if out.code != 1 || out.stdout != "" || !strings.HasPrefix(out.stderr, tt.want) || strings.Count(out.stderr, "\n") != 1 {
				t.Errorf("enqueue = %d, stdout %q, stderr %q; want 1, nothing, %q...", out.code, out.stdout, out.stderr, tt.want)
			}
		})
	}
	if q, err := h.insp.GetQueueInfo("default"); err == nil && q.Size != 0 {
		t.Errorf("%d tasks in the queue, want none", q.Size)
	}
	var none *harness
	out := none.run(invocation{args: []string{"-to", "a", "-template", "t", "-send-at", "at nine"}})
	want := `enqueue: invalid value "at nine" for flag -send-at: must be an RFC 3339 time (2026-11-22T10:00:00Z) or a duration from now (90m)` + "\nRun 'enqueue -h' for usage.\n"
	if out.code != 2 || out.stderr != want {
		t.Errorf("-send-at at nine: %d %q, want 2 %q", out.code, out.stderr, want)
	}
}

// TestFileScheduled: JSONL lines with send_at or send_at_local are
// scheduled; one with both is reported and skipped.
func TestFileScheduled(t *testing.T) {
	h := newHarness(t)
	in := `{"recipient":"a@example.com","template":"t","send_at":"2099-01-01T09:00:00Z","idempotency_key":"s1"}
{"recipient":"b@example.com","template":"t","send_at_local":"23:30","tz":"America/New_York","idempotency_key":"s2"}
{"recipient":"c@example.com","template":"t","send_at":"2099-01-01T09:00:00Z","send_at_local":"09:00"}
{"recipient":"d@example.com","template":"t","send_at_local":"25:00"}
`
	before := time.Now()
	out := h.run(invocation{args: []string{"-config", testConfig, "-file", "-"}, stdin: strings.NewReader(in)})
	after := time.Now()
	want := `stdin:3: send_at_local: given with send_at: give one moment, an instant or a time of day
stdin:4: send_at_local: must be a time of day HH:MM or HH:MM:SS such as 09:00 (got "25:00")
enqueued 2, duplicates 0, rejected 2 (4 lines)
`
	if out.code != 1 || out.stderr != want {
		t.Fatalf("enqueue = %d, stderr:\n%s\nwant 1, stderr:\n%s", out.code, out.stderr, want)
	}
	at := time.Date(2099, 1, 1, 9, 0, 0, 0, time.UTC)
	within(t, "line 1", h.scheduled("default", message.TaskID("s1")).SendAt, at, at)
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	first, _ := intake.NextLocal("23:30", newYork, before)
	last, _ := intake.NextLocal("23:30", newYork, after)
	within(t, "line 2", h.scheduled("default", message.TaskID("s2")).SendAt, first, last)
}
