package main

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/intake"
)

// TestReportOrder feeds a report items out of order, as the senders finish
// them: reports come out in line order, and a failure stops them at its line
// however late it arrives, with the lines past it that were enqueued named.
func TestReportOrder(t *testing.T) {
	tests := []struct {
		name  string
		items []item // in the order they finish
		want  string
	}{{
		name: "all done",
		items: []item{
			{seq: 2, line: 4, state: stateRejected, err: errors.New("template: missing")},
			{seq: 1, line: 2, state: stateRejected, err: errors.New("recipient: missing")},
			{seq: 3, line: 6, state: stateEnd},
			{seq: 0, line: 1, state: stateDuplicate},
		},
		want: "in.jsonl:2: recipient: missing\nin.jsonl:4: template: missing\n" +
			"enqueued 0, duplicates 1, rejected 2 (6 lines)\n",
	}, {
		name: "failure",
		items: []item{
			{seq: 4, line: 5, state: stateRejected, err: errors.New("template: missing")}, // past the failure: not reported
			{seq: 3, line: 4, state: stateEnqueued},                                       // past the failure: done all the same
			{seq: 0, line: 1, state: stateEnqueued},
			{seq: 2, line: 3, state: stateFailed, err: errors.New("connection refused")},
			{seq: 5, line: 6, state: stateEnqueued},
			{seq: 6, line: 7, state: stateEnqueued, job: intake.Job{Keyed: true}}, // a duplicate when resumed
			{seq: 1, line: 2, state: stateRejected, err: errors.New("recipient: missing")},
		},
		want: "in.jsonl:2: recipient: missing\n" +
			"enqueue: in.jsonl:3: connection refused\n" +
			"enqueue: stopped: lines 1-2 are done, 1 enqueued; resume from line 3: tail -n +3 in.jsonl | enqueue -file -\n" +
			"enqueue: lines 4, 6 past line 3, without an idempotency_key, enqueued as well: resuming enqueues them again\n" +
			"enqueued 1, duplicates 0, rejected 1 (2 lines)\n",
	}, {
		name: "read error",
		items: []item{
			{seq: 0, line: 1, state: stateEnqueued},
			{seq: 1, line: 1, state: stateEnd, err: errors.New("disk on fire")},
		},
		want: "enqueue: in.jsonl: reading line 2: disk on fire\n" +
			"enqueue: stopped: lines 1-1 are done, 1 enqueued; resume from line 2: tail -n +2 in.jsonl | enqueue -file -\n" +
			"enqueued 1, duplicates 0, rejected 0 (1 lines)\n",
	}, {
		name: "failure on line 1",
		items: []item{
			{seq: 0, line: 1, state: stateFailed, err: errors.New("connection refused")},
		},
		want: "enqueue: in.jsonl:1: connection refused\n" +
			"enqueue: stopped: no line is done; resume from line 1: tail -n +1 in.jsonl | enqueue -file -\n" +
			"enqueued 0, duplicates 0, rejected 0 (0 lines)\n",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			w := bufio.NewWriter(&out)
			slots := make(chan struct{}, len(tt.items))
			for range tt.items {
				slots <- struct{}{}
			}
			r := &report{name: "in.jsonl", out: w, slots: slots, pending: map[int]item{}}
			for _, it := range tt.items {
				r.add(it)
			}
			_ = r.finish(resumeHint(&options{config: "config.yaml", file: "in.jsonl"}), nil)
			w.Flush()
			if out.String() != tt.want {
				t.Errorf("report:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"notifications.jsonl":     "notifications.jsonl",
		"/data/2026-11/a_b.jsonl": "/data/2026-11/a_b.jsonl",
		"my file.jsonl":           "'my file.jsonl'",
		"it's.jsonl":              `'it'\''s.jsonl'`,
		"":                        "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
