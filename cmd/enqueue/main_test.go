package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/message"
)

const testConfig = "testdata/config.yaml"

// shared is the redis-server the package's tests share, each test in a
// database of its own.
var shared *redistest.Shared

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // as main does: failed dials are enqueue's to report
	os.Exit(redistest.RunShared(m, &shared))
}

// harness is one test's redis database and the asynq view of it.
type harness struct {
	t    *testing.T
	srv  *redistest.Server
	addr string // host:port/db
	rdb  *redis.Client
	insp *asynq.Inspector
}

// newHarness gives the test a fresh database of the shared server.
func newHarness(t *testing.T) *harness {
	t.Helper()
	rdb, db := shared.NewClient(t)
	return &harness{t: t, srv: shared.Server, addr: fmt.Sprintf("%s/%d", shared.Addr, db), rdb: rdb,
		insp: asynq.NewInspectorFromRedisClient(rdb)}
}

// newOwnHarness starts a redis-server of the test's own, for tests that stop it.
func newOwnHarness(t *testing.T) *harness {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	return &harness{t: t, srv: srv, addr: srv.Addr + "/0", rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb)}
}

// outcome is what one run of enqueue did.
type outcome struct {
	code           int
	stdout, stderr string
}

// invocation says how to run enqueue: the args after -config, stdin and
// whether stderr is a terminal.
type invocation struct {
	args     []string
	stdin    io.Reader
	terminal bool
	ctx      context.Context
}

// run runs enqueue with the test config and REDIS_URL set to the harness's
// server (nil h: REDIS_URL unset).
func (h *harness) run(inv invocation) outcome {
	var stdout, stderr bytes.Buffer
	env := map[string]string{}
	if h != nil {
		env["REDIS_URL"] = "redis://" + h.addr
	}
	if inv.stdin == nil {
		inv.stdin = strings.NewReader("")
	}
	if inv.ctx == nil {
		inv.ctx = context.Background()
	}
	code := run(inv.ctx, inv.args, process{
		stdin: inv.stdin, stdout: &stdout, stderr: &stderr,
		getenv:   func(k string) string { return env[k] },
		terminal: inv.terminal,
	})
	return outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// runArgs runs enqueue -config testdata/config.yaml args...
func (h *harness) runArgs(args ...string) outcome {
	return h.run(invocation{args: append([]string{"-config", testConfig}, args...)})
}

// task returns the notification of task id in queue, failing the test if
// it is not there or not a pending notify task.
func (h *harness) task(queue, id string) message.Notification {
	h.t.Helper()
	info, err := h.insp.GetTaskInfo(queue, id)
	if err != nil {
		h.t.Fatalf("task %s in queue %s: %v", id, queue, err)
	}
	if info.Type != message.TaskType || info.State != asynq.TaskStatePending || info.MaxRetry != message.DefaultMaxRetry {
		h.t.Errorf("task %s: type %q, state %v, max retry %d; want %q, pending, %d",
			id, info.Type, info.State, info.MaxRetry, message.TaskType, message.DefaultMaxRetry)
	}
	n, err := message.Decode(info.Payload)
	if err != nil {
		h.t.Fatalf("task %s: payload %s: %v", id, info.Payload, err)
	}
	if n.Queued == nil || time.Since(*n.Queued) > time.Minute {
		h.t.Errorf("task %s: queued_at %v, want the time it was enqueued", id, n.Queued)
	}
	n.Queued = nil // compared apart: it is the enqueue's clock
	return n
}

// pending returns the number of pending tasks in each queue that has any.
func (h *harness) pending() map[string]int {
	h.t.Helper()
	queues, err := h.insp.Queues()
	if err != nil {
		h.t.Fatal(err)
	}
	got := map[string]int{}
	for _, q := range queues {
		info, err := h.insp.GetQueueInfo(q)
		if err != nil {
			h.t.Fatal(err)
		}
		if info.Pending > 0 {
			got[q] = info.Pending
		}
	}
	return got
}

// pendingTasks returns the notifications pending in queue, by task ID.
func (h *harness) pendingTasks(queue string) map[string]message.Notification {
	h.t.Helper()
	infos, err := h.insp.ListPendingTasks(queue, asynq.PageSize(1000))
	if err != nil {
		h.t.Fatal(err)
	}
	got := map[string]message.Notification{}
	for _, info := range infos {
		n, err := message.Decode(info.Payload)
		if err != nil {
			h.t.Fatalf("task %s: %v", info.ID, err)
		}
		got[info.ID] = n
	}
	return got
}

func wantPending(t *testing.T, h *harness, want map[string]int) {
	t.Helper()
	if got := h.pending(); !reflect.DeepEqual(got, want) {
		t.Errorf("pending tasks by queue = %v, want %v", got, want)
	}
}

var uuidLine = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\n$`)

func TestOneWithDefaults(t *testing.T) {
	h := newHarness(t)
	out := h.runArgs("-to", "alice@example.com", "-template", "welcome", "-data", `{"name": "Alice"}`)
	if out.code != 0 || !uuidLine.MatchString(out.stdout) || out.stderr != "" {
		t.Fatalf("enqueue = %d, stdout %q, stderr %q; want 0, a task ID, nothing", out.code, out.stdout, out.stderr)
	}
	got := h.task("default", strings.TrimSpace(out.stdout))
	want := message.Notification{Recipient: "alice@example.com", Policy: "marketing", Provider: "console",
		Template: "welcome", Data: json.RawMessage(`{"name":"Alice"}`)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("task payload:\n got %+v\nwant %+v", got, want)
	}
	wantPending(t, h, map[string]int{"default": 1})
}

func TestOneWithEveryFlag(t *testing.T) {
	h := newHarness(t)
	before := time.Now()
	out := h.runArgs("-to", "+15551234567", "-template", "otp", "-policy", "transactional",
		"-provider", "sms", "-queue", "critical", "-key", "otp-42", "-send-by", "90m", "-tz", "Europe/London", "-tenant", "billing")
	after := time.Now()
	if out.code != 0 || out.stderr != "" {
		t.Fatalf("enqueue = %d, stderr %q", out.code, out.stderr)
	}
	id := strings.TrimSpace(out.stdout)
	if id != message.TaskID("otp-42") {
		t.Errorf("task ID = %s, want message.TaskID(otp-42) = %s", id, message.TaskID("otp-42"))
	}
	n := h.task("critical", id)
	if n.Recipient != "+15551234567" || n.Template != "otp" || n.Policy != "transactional" || n.Provider != "sms" || n.Data != nil || n.TZ != "Europe/London" || n.Tenant != "billing" {
		t.Errorf("task payload = %+v", n)
	}
	if n.SendBy == nil || n.SendBy.Before(before.Add(90*time.Minute).Truncate(time.Second)) || n.SendBy.After(after.Add(90*time.Minute)) {
		t.Errorf("send_by = %v, want 90m after %v", n.SendBy, before)
	}
	wantPending(t, h, map[string]int{"critical": 1})
}

func TestOneSendByTime(t *testing.T) {
	h := newHarness(t)
	out := h.runArgs("-to", "bob@example.com", "-template", "digest", "-send-by", "2099-11-22T10:00:00+01:00")
	if out.code != 0 {
		t.Fatalf("enqueue = %d, stderr %q", out.code, out.stderr)
	}
	n := h.task("default", strings.TrimSpace(out.stdout))
	if want := time.Date(2099, 11, 22, 9, 0, 0, 0, time.UTC); n.SendBy == nil || !n.SendBy.Equal(want) {
		t.Errorf("send_by = %v, want %v", n.SendBy, want)
	}
}

func TestOneDuplicate(t *testing.T) {
	h := newHarness(t)
	args := []string{"-to", "alice@example.com", "-template", "welcome", "-key", "welcome-alice"}
	first := h.runArgs(args...)
	second := h.runArgs(args...)
	id := message.TaskID("welcome-alice")
	if first.code != 0 || first.stdout != id+"\n" || first.stderr != "" {
		t.Fatalf("first enqueue = %d, stdout %q, stderr %q", first.code, first.stdout, first.stderr)
	}
	wantErr := "enqueue: duplicate: task " + id + ` (idempotency key "welcome-alice") is already in queue default; not enqueued again` + "\n"
	if second.code != 0 || second.stdout != id+"\n" || second.stderr != wantErr {
		t.Errorf("second enqueue = %d, stdout %q, stderr %q; want 0, %q, %q", second.code, second.stdout, second.stderr, id+"\n", wantErr)
	}
	wantPending(t, h, map[string]int{"default": 1})
	// Kept after completion, so the key still dedupes after delivery.
	info, err := h.insp.GetTaskInfo("default", id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Retention != intake.KeyRetention {
		t.Errorf("retention of a keyed task %v, want %v", info.Retention, intake.KeyRetention)
	}
	// A task without a key needs no retention: its ID is never reused.
	other := h.runArgs("-to", "bob@example.com", "-template", "welcome")
	info, err = h.insp.GetTaskInfo("default", strings.TrimSpace(other.stdout))
	if err != nil {
		t.Fatal(err)
	}
	if info.Retention != 0 {
		t.Errorf("retention of an unkeyed task %v, want 0", info.Retention)
	}
}

// TestOneRejected checks notifications the config or the payload rules
// reject: exit status 1, one message, nothing enqueued.
func TestOneRejected(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"undefined policy", []string{"-to", "a@example.com", "-template", "t", "-policy", "vip"},
			`enqueue: policy "vip" is not defined in testdata/config.yaml (defined: marketing, transactional)`},
		{"undefined provider", []string{"-to", "a@example.com", "-template", "t", "-provider", "pigeon"},
			`enqueue: provider "pigeon" is not defined in testdata/config.yaml (defined: console, sms)`},
		{"undefined queue", []string{"-to", "a@example.com", "-template", "t", "-queue", "bulk"},
			`enqueue: queue "bulk" is not defined in testdata/config.yaml (defined: critical, default, low)`},
		{"long recipient", []string{"-to", strings.Repeat("a", 257), "-template", "t"},
			`enqueue: recipient: 257 bytes, longer than 256`},
		{"past deadline", []string{"-to", "a@example.com", "-template", "t", "-send-by", "2001-09-09T01:46:40Z"},
			`enqueue: send_by: 2001-09-09T01:46:40Z is in the past`},
		{"unknown zone", []string{"-to", "a@example.com", "-template", "t", "-tz", "EST5EDT/Nowhere"},
			`enqueue: tz: unknown time zone "EST5EDT/Nowhere" (an IANA zone such as Europe/Paris)`},
		{"long tenant", []string{"-to", "a@example.com", "-template", "t", "-tenant", strings.Repeat("t", 257)},
			`enqueue: tenant: 257 bytes, longer than 256`},
		{"tenant with a line break", []string{"-to", "a@example.com", "-template", "t", "-tenant", "team\na"},
			`enqueue: tenant: control character U+000A (byte 5)`},
		{"recipient with a NUL", []string{"-to", "a\x00b@example.com", "-template", "t"},
			`enqueue: recipient: control character U+0000 (byte 2)`},
		{"misspelled provider", []string{"-to", "a@example.com", "-template", "t", "-provider", "sns"},
			`enqueue: provider "sns" is not defined in testdata/config.yaml (did you mean sms?)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := h.runArgs(tt.args...)
			if out.code != 1 || out.stdout != "" || out.stderr != tt.want+"\n" {
				t.Errorf("enqueue = %d, stdout %q, stderr %q; want 1, nothing, %q", out.code, out.stdout, out.stderr, tt.want)
			}
		})
	}
	wantPending(t, h, map[string]int{})
}

func TestOneNoDefaults(t *testing.T) {
	h := newHarness(t)
	out := h.run(invocation{args: []string{"-config", "testdata/nodefaults.yaml", "-to", "a@example.com", "-template", "t"}})
	if want := "enqueue: policy: missing\n"; out.code != 1 || out.stderr != want {
		t.Errorf("enqueue = %d, stderr %q; want 1, %q", out.code, out.stderr, want)
	}
	out = h.run(invocation{args: []string{"-config", "testdata/nodefaults.yaml", "-to", "a@example.com", "-template", "t",
		"-policy", "marketing", "-provider", "console"}})
	if out.code != 0 {
		t.Fatalf("enqueue = %d, stderr %q", out.code, out.stderr)
	}
	h.task("default", strings.TrimSpace(out.stdout))
}

// TestUsageErrors checks mistakes on the command line: exit status 2 and a
// message, before the config is read or Redis is reached.
func TestUsageErrors(t *testing.T) {
	const hint = "\nRun 'enqueue -h' for usage.\n"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "enqueue: nothing to enqueue: give -to and -template, -file, -campaigns, -trigger NAME, -suppressions PROVIDER or -unsuppress PROVIDER:ADDRESS"},
		{"only config", []string{"-config", testConfig}, "enqueue: nothing to enqueue: give -to and -template, -file, -campaigns, -trigger NAME, -suppressions PROVIDER or -unsuppress PROVIDER:ADDRESS"},
		{"file and to", []string{"-file", "x.jsonl", "-to", "a@example.com"}, "enqueue: -to and -file cannot be used together"},
		{"file and queue", []string{"-queue", "low", "-file", "x.jsonl"}, "enqueue: -queue and -file cannot be used together"},
		{"file and tenant", []string{"-file", "x.jsonl", "-tenant", "billing"}, "enqueue: -tenant and -file cannot be used together"},
		{"no recipient", []string{"-template", "welcome"}, "enqueue: -to RECIPIENT is required to enqueue one notification"},
		{"no template", []string{"-to", "a@example.com"}, "enqueue: -template NAME is required to enqueue one notification"},
		{"empty file", []string{"-file", ""}, "enqueue: -file needs a path, or - for stdin"},
		{"unknown flag", []string{"-recipient", "a"}, "enqueue: flag provided but not defined: -recipient"},
		{"bad send-by", []string{"-to", "a", "-template", "t", "-send-by", "tomorrow"},
			`enqueue: invalid value "tomorrow" for flag -send-by: must be an RFC 3339 time (2026-11-22T10:00:00Z) or a duration from now (90m)`},
		{"negative send-by", []string{"-to", "a", "-template", "t", "-send-by", "-5m"},
			`enqueue: invalid value "-5m" for flag -send-by: must be a duration > 0`},
		{"bad data", []string{"-to", "a", "-template", "t", "-data", `{"a":`},
			`enqueue: invalid value "{\"a\":" for flag -data: must be a JSON object`},
		{"data array", []string{"-to", "a", "-template", "t", "-data", `[1]`},
			`enqueue: invalid value "[1]" for flag -data: must be a JSON object`},
		{"argument", []string{"-to", "a", "-template", "t", "extra"},
			`enqueue: unexpected argument "extra": flags come first, values need their flag`},
		{"missing value", []string{"-to"}, "enqueue: flag needs an argument: -to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h *harness // no Redis: none must be needed
			out := h.run(invocation{args: tt.args})
			if out.code != 2 || out.stdout != "" || out.stderr != tt.want+hint {
				t.Errorf("enqueue %q = %d, stdout %q, stderr %q;\nwant 2, nothing, %q", tt.args, out.code, out.stdout, out.stderr, tt.want+hint)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var h *harness
		out := h.run(invocation{args: []string{arg}})
		if out.code != 0 || out.stderr != "" {
			t.Errorf("enqueue %s = %d, stderr %q; want 0 and nothing", arg, out.code, out.stderr)
		}
		for _, want := range []string{
			"Usage:\n  enqueue [-config config.yaml] -to RECIPIENT -template NAME",
			"Examples:\n",
			"enqueue -to alice@example.com -template welcome -data '{\"name\":\"Alice\"}'\n",
			"zcat big.jsonl.gz | enqueue -file -\n",
			`"idempotency_key":"welcome-alice","send_by":"2026-11-22T10:00:00Z",`,
			`"tenant":"growth"}`,
			"Exit status: 0",
			"REDIS_URL overrides redis.url",
			"  -send-by time\n", // the flags, from PrintDefaults
			"  -tenant name\n",
			"  -send-at time\n",
			"  -send-at-local HH:MM\n",
			`"send_at_local":"09:00"`,
		} {
			if !strings.Contains(out.stdout, want) {
				t.Errorf("enqueue %s: usage lacks %q:\n%s", arg, want, out.stdout)
			}
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		want   string
		prefix bool // want is the start of stderr: the rest is the network's
	}{
		{"invalid", []string{"-config", "testdata/broken.yaml", "-to", "a", "-template", "t"},
			"testdata/broken.yaml:4: policies.marketing[0].limit: must be > 0 (got 0)\n", false},
		{"invalid, file mode", []string{"-config", "testdata/broken.yaml", "-file", "testdata/mixed.jsonl"},
			"testdata/broken.yaml:4: policies.marketing[0].limit: must be > 0 (got 0)\n", false},
		{"missing", []string{"-config", "testdata/none.yaml", "-file", "testdata/mixed.jsonl"},
			"enqueue: config: open testdata/none.yaml: no such file or directory\n", false},
		{"redis unreachable", []string{"-config", testConfig, "-to", "a", "-template", "t"},
			"enqueue: config: connect to redis redis://127.0.0.1:1/0: ", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h *harness // REDIS_URL unset: the config's URL, where no server listens
			out := h.run(invocation{args: tt.args})
			got := out.stderr
			if tt.prefix && strings.HasPrefix(got, tt.want) && strings.Count(got, "\n") == 1 {
				got = tt.want
			}
			if out.code != 1 || out.stdout != "" || got != tt.want {
				t.Errorf("enqueue = %d, stdout %q, stderr %q; want 1, nothing, %q", out.code, out.stdout, out.stderr, tt.want)
			}
		})
	}
}
