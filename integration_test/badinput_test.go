//go:build integration

package integration_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/message"
)

// TestWorkerRefusesBadConfig runs the worker binary on a few of
// config/testdata's broken files: it must not start, must print the exact
// message config's own tests expect (after "worker: ") on stderr, nothing
// else, and exit with status 1. It runs in config/ so that the file names
// in the messages are those of config/errors_test.go.
func TestWorkerRefusesBadConfig(t *testing.T) {
	bin := buildBinary(t, "worker")
	dir := filepath.Join(moduleRoot(t), "config")
	tests := []struct{ file, want string }{
		{"unknown_key.yaml", `testdata/unknown_key.yaml:2: worker.concurency: unknown key (did you mean concurrency?)`},
		{"zero_per.yaml", `testdata/zero_per.yaml:4: policies.marketing[1].per: must be > 0 (got 0s)`},
		{"bad_duration.yaml", `testdata/bad_duration.yaml:5: providers.sms.timeout: not a duration such as 500ms, 90s, 1h30m or 7d (got "5 seconds")`},
		{"undefined_provider.yaml", `testdata/undefined_provider.yaml:4: defaults.provider: provider "email" is not defined (defined: console)`},
		{"webhook_without_url.yaml", `testdata/webhook_without_url.yaml:2: providers.sms.url: required for a webhook provider`},
		{"syntax_error.yaml", `testdata/syntax_error.yaml:2: found a tab character that violates indentation`},
		{"bad_redis_scheme.yaml", `testdata/bad_redis_scheme.yaml:2: redis.url: must be embedded or a redis://, rediss:// or unix:// URL (got "http://127.0.0.1:6379")`},
		{"many_mistakes.yaml", `testdata/many_mistakes.yaml:4: worker.concurency: unknown key (did you mean concurrency?)
testdata/many_mistakes.yaml:5: worker.jitter: not a duration such as 500ms, 90s, 1h30m or 7d (got "soon")
testdata/many_mistakes.yaml:8: policies.marketing[0].limit: must be > 0 (got 0)
testdata/many_mistakes.yaml:10: providers.sms.url: required for a webhook provider
testdata/many_mistakes.yaml:13: providers.sms.burst: must be > 0 (got 0)
testdata/many_mistakes.yaml:15: defaults.policy: policy "marketting" is not defined (defined: marketing)`},
		{"no_such_file.yaml", `config: open testdata/no_such_file.yaml: no such file or directory`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			stdout, stderr, code := runCommand(t, dir, nil, bin, "-config", filepath.Join("testdata", tt.file))
			if want := "worker: " + tt.want + "\n"; stderr != want || code != 1 || stdout != "" {
				t.Errorf("worker -config testdata/%s: exit %d\nstderr:\n%s\nstdout:\n%s\nwant exit 1 and stderr:\n%s",
					tt.file, code, stderr, stdout, want)
			}
		})
	}
}

// TestEnqueueRejectsBadLines runs the enqueue binary on a JSONL file with
// good, bad, blank and duplicate lines: each bad line is reported as
// FILE:LINE: message, in order, the summary is the last line, the exit
// status is 1, and exactly the good lines are on the queue. The same from
// stdin (-file -), a usage error (status 2) and a bad config (status 1).
func TestEnqueueRejectsBadLines(t *testing.T) {
	t.Parallel() // no bound a busy core breaks: it runs beside the chaos runs
	bin := buildBinary(t, "enqueue")
	f := newFleet(t, fleetConfig{
		Concurrency: 1, ShutdownTimeout: time.Second, InlineWait: time.Second,
		Policy: "[{limit: 1, per: 1h}]", Rate: 1, Burst: 1,
	}, nil)
	f.writeConfig("enqueue", "")
	lines := []string{
		/* 1 */ `{"recipient":"a@example.com","template":"news","idempotency_key":"bad-1"}`,
		/* 2 */ `{"recipient":"b@example.com","template":"news","recipent":"x"}`,
		/* 3 */ `{"template":"news"}`,
		/* 4 */ `not json`,
		/* 5 */ `{"recipient":"c@example.com","template":"news","policy":"vip"}`,
		/* 6 */ `{"recipient":"d@example.com","template":"news","send_by":"tomorrow"}`,
		/* 7 */ `{"recipient":"e@example.com","template":"news","send_by":"2020-01-01T00:00:00Z"}`,
		/* 8 */ `["x"]`,
		/* 9 */ `{"recipient":"f@example.com","template":"news","data":{"x":1},"idempotency_key":"bad-9","send_by":"2099-01-01T00:00:00Z"}`,
		/* 10 */ `{"recipient":"g@example.com","template":"news","data":"x"}`,
		/* 11 */ ``,
		/* 12 */ `{"recipient":"a@example.com","template":"news","idempotency_key":"bad-1"}`,
		/* 13 */ `{"recipient":"h@example.com","template":"news","provider":"sms"}`,
		/* 14 */ `{"recipient":"i@example.com","template":"news","queue":"bulk"}`,
		/* 15 */ `{"recipient":"j@example.com"}`,
		/* 16 */ `{"recipient":"k@example.com","template":"news","idempotency_key":7}`,
	}
	file := filepath.Join(f.dir, "lines.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := `lines.jsonl:2: unknown field "recipent" (did you mean recipient?)
lines.jsonl:3: recipient: missing
lines.jsonl:4: not JSON: invalid character 'o' in literal null (expecting 'u') (column 2)
lines.jsonl:5: policy "vip" is not defined in enqueue.yaml (defined: pace)
lines.jsonl:6: send_by: must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got "tomorrow")
lines.jsonl:7: send_by: 2020-01-01T00:00:00Z is in the past
lines.jsonl:8: must be a JSON object (got array)
lines.jsonl:10: data: must be a JSON object (got string)
lines.jsonl:13: provider "sms" is not defined in enqueue.yaml (defined: hook)
lines.jsonl:14: queue "bulk" is not defined in enqueue.yaml (defined: default)
lines.jsonl:15: template: missing
lines.jsonl:16: idempotency_key: must be a string (got number)
enqueued 2, duplicates 1, rejected 12 (16 lines)
`
	stdout, stderr, code := runCommand(t, f.dir, nil, bin, "-config", "enqueue.yaml", "-file", "lines.jsonl")
	if stderr != want || code != 1 {
		t.Errorf("enqueue -file lines.jsonl: exit %d, stderr:\n%s\nwant exit 1, stderr:\n%s", code, stderr, want)
	}
	if stdout != "" {
		t.Errorf("enqueue -file printed on stdout: %q", stdout)
	}
	pending, err := f.insp.ListPendingTasks(fleetQueue)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, ti := range pending {
		n, err := message.Decode(ti.Payload)
		if err != nil {
			t.Errorf("pending task %s: %v", ti.ID, err)
		}
		got[ti.ID] = n.Recipient
	}
	wantQueued := map[string]string{message.TaskID("bad-1"): "a@example.com", message.TaskID("bad-9"): "f@example.com"}
	if len(got) != len(wantQueued) || got[message.TaskID("bad-1")] != "a@example.com" || got[message.TaskID("bad-9")] != "f@example.com" {
		t.Errorf("queued after the bad file: %v, want %v", got, wantQueued)
	}

	// From stdin: the messages name it.
	stdin := strings.NewReader(`{"recipient":"l@example.com","template":"news","idempotency_key":"bad-stdin"}` + "\n" +
		`{"recipient":"m@example.com","template":"news","colour":"red"}` + "\n")
	_, stderr, code = runCommand(t, f.dir, stdin, bin, "-config", "enqueue.yaml", "-file", "-")
	want = `stdin:2: unknown field "colour" (fields: recipient, template, policy, provider, queue, data, idempotency_key, send_by, send_at, send_at_local, tz, tenant)
enqueued 1, duplicates 0, rejected 1 (2 lines)
`
	if stderr != want || code != 1 {
		t.Errorf("enqueue -file -: exit %d, stderr:\n%s\nwant exit 1, stderr:\n%s", code, stderr, want)
	}

	// A mistake on the command line: status 2, nothing enqueued.
	before := f.queueState().Pending
	_, stderr, code = runCommand(t, f.dir, nil, bin, "-config", "enqueue.yaml", "-to", "n@example.com")
	want = "enqueue: -template NAME is required to enqueue one notification\nRun 'enqueue -h' for usage.\n"
	if stderr != want || code != 2 {
		t.Errorf("enqueue without -template: exit %d, stderr:\n%s\nwant exit 2, stderr:\n%s", code, stderr, want)
	}
	// A broken config: its message, status 1, nothing enqueued.
	cfg := filepath.Join(moduleRoot(t), "config", "testdata", "zero_per.yaml")
	_, stderr, code = runCommand(t, f.dir, nil, bin, "-config", cfg, "-to", "n@example.com", "-template", "news")
	want = cfg + ":4: policies.marketing[1].per: must be > 0 (got 0s)\n"
	if stderr != want || code != 1 {
		t.Errorf("enqueue -config zero_per.yaml: exit %d, stderr:\n%s\nwant exit 1, stderr:\n%s", code, stderr, want)
	}
	if after := f.queueState().Pending; after != before {
		t.Errorf("pending tasks went from %d to %d after the failed runs", before, after)
	}
}
