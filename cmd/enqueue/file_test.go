package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/message"
)

// TestFileMixed enqueues a file with good and bad lines, blank lines, CRLF
// endings and no final line break, twice: the second time the lines with an
// idempotency key are duplicates.
func TestFileMixed(t *testing.T) {
	h := newHarness(t)
	const wantRejects = `testdata/mixed.jsonl:3: policy "vip" is not defined in testdata/config.yaml (defined: marketing, transactional)
testdata/mixed.jsonl:6: recipient: missing
`
	out := h.runArgs("-file", "testdata/mixed.jsonl")
	if want := wantRejects + "enqueued 4, duplicates 0, rejected 2 (8 lines)\n"; out.code != 1 || out.stdout != "" || out.stderr != want {
		t.Fatalf("enqueue = %d, stdout %q, stderr:\n%s\nwant 1, nothing, stderr:\n%s", out.code, out.stdout, out.stderr, want)
	}
	wantPending(t, h, map[string]int{"default": 3, "critical": 1})

	alice := h.task("default", message.TaskID("mixed-1"))
	if want := (message.Notification{Recipient: "alice@example.com", Policy: "marketing", Provider: "console",
		Template: "welcome", Data: json.RawMessage(`{"name":"Alice","n":[1,2]}`)}); !reflect.DeepEqual(alice, want) {
		t.Errorf("line 1:\n got %+v\nwant %+v", alice, want)
	}
	otp := h.task("critical", message.TaskID("mixed-4"))
	sendBy := time.Date(2099, 11, 22, 10, 0, 0, 0, time.UTC)
	if otp.Recipient != "+15551234567" || otp.Policy != "transactional" || otp.Provider != "sms" ||
		otp.Template != "otp" || otp.SendBy == nil || !otp.SendBy.Equal(sendBy) {
		t.Errorf("line 4: %+v", otp)
	}
	dave := h.task("default", message.TaskID("mixed-8"))
	if want := (message.Notification{Recipient: "dave@example.com", Policy: "marketing", Provider: "console",
		Template: "digest"}); !reflect.DeepEqual(dave, want) {
		t.Errorf("line 8 (null fields):\n got %+v\nwant %+v", dave, want)
	}
	var carol []string
	for id, n := range h.pendingTasks("default") {
		if n.Recipient == "carol@example.com" {
			carol = append(carol, id)
		}
	}
	if len(carol) != 1 {
		t.Errorf("line 7 (no idempotency key): %d tasks for carol, want 1", len(carol))
	}

	again := h.runArgs("-file", "testdata/mixed.jsonl")
	if want := wantRejects + "enqueued 1, duplicates 3, rejected 2 (8 lines)\n"; again.code != 1 || again.stderr != want {
		t.Errorf("second enqueue = %d, stderr:\n%s\nwant 1, stderr:\n%s", again.code, again.stderr, want)
	}
	wantPending(t, h, map[string]int{"default": 4, "critical": 1})
}

// TestFileTenant: a line's tenant is its task's; a line without one has
// none (the default tenant).
func TestFileTenant(t *testing.T) {
	h := newHarness(t)
	in := `{"recipient":"a@example.com","template":"t","tenant":"billing","idempotency_key":"t1"}
{"recipient":"b@example.com","template":"t","tenant":null,"idempotency_key":"t2"}
`
	out := h.run(invocation{args: []string{"-config", testConfig, "-file", "-"}, stdin: strings.NewReader(in)})
	if want := "enqueued 2, duplicates 0, rejected 0 (2 lines)\n"; out.code != 0 || out.stderr != want {
		t.Fatalf("enqueue = %d, stderr %q; want 0, %q", out.code, out.stderr, want)
	}
	if got := h.task("default", message.TaskID("t1")).Tenant; got != "billing" {
		t.Errorf("line 1: tenant %q, want billing", got)
	}
	if got := h.task("default", message.TaskID("t2")).Tenant; got != "" {
		t.Errorf("line 2: tenant %q, want none", got)
	}
}

// TestFileStdin reads stdin: a key given twice is one task and a
// duplicate, and all enqueued (duplicates included) is exit status 0.
func TestFileStdin(t *testing.T) {
	h := newHarness(t)
	var in strings.Builder
	for i := 1; i <= 300; i++ {
		switch {
		case i%50 == 0:
			in.WriteString("\n") // blank
		case i%2 == 0:
			fmt.Fprintf(&in, `{"recipient":"r%d@example.com","template":"news","queue":"low","idempotency_key":"k%d"}`+"\n", i, i)
		default:
			fmt.Fprintf(&in, `{"recipient":"r%d@example.com","template":"news","data":{"i":%d}}`+"\n", i, i)
		}
	}
	in.WriteString(`{"recipient":"again@example.com","template":"news","queue":"low","idempotency_key":"k2"}` + "\n")
	out := h.run(invocation{args: []string{"-config", testConfig, "-file", "-"}, stdin: strings.NewReader(in.String())})
	if want := "enqueued 294, duplicates 1, rejected 0 (301 lines)\n"; out.code != 0 || out.stdout != "" || out.stderr != want {
		t.Fatalf("enqueue = %d, stdout %q, stderr %q; want 0, nothing, %q", out.code, out.stdout, out.stderr, want)
	}
	wantPending(t, h, map[string]int{"default": 150, "low": 144})
	if n := h.task("low", message.TaskID("k2")); n.Recipient != "r2@example.com" {
		t.Errorf("task of key k2 is for %s, want the first line's r2@example.com", n.Recipient)
	}

	bad := h.run(invocation{args: []string{"-config", testConfig, "-file", "-"},
		stdin: strings.NewReader("\r\n" + `{"recipient":"x@example.com"}` + "\r\n")})
	if want := "stdin:2: template: missing\nenqueued 0, duplicates 0, rejected 1 (2 lines)\n"; bad.code != 1 || bad.stderr != want {
		t.Errorf("enqueue = %d, stderr %q; want 1, %q", bad.code, bad.stderr, want)
	}
}

func TestFileEmpty(t *testing.T) {
	h := newHarness(t)
	out := h.run(invocation{args: []string{"-config", testConfig, "-file", "-"}, stdin: strings.NewReader("\n \r\n\t\n")})
	if want := "enqueued 0, duplicates 0, rejected 0 (3 lines)\n"; out.code != 0 || out.stderr != want {
		t.Errorf("enqueue = %d, stderr %q; want 0, %q", out.code, out.stderr, want)
	}
}

// TestBadLines runs each file of testdata/bad, one mistake each, and checks
// the exact message and that nothing was enqueued.
func TestBadLines(t *testing.T) {
	h := newHarness(t)
	tests := map[string]string{
		"not_json.jsonl":           `not JSON: invalid character '}' looking for beginning of object key string (column 51)`,
		"two_objects.jsonl":        `not JSON: invalid character '{' after top-level value (column 52)`,
		"unterminated.jsonl":       `not JSON: the line ends inside a value`,
		"array.jsonl":              `must be a JSON object (got array)`,
		"string.jsonl":             `must be a JSON object (got string)`,
		"misspelled_field.jsonl":   `unknown field "recipent" (did you mean recipient?)`,
		"capitalized_field.jsonl":  `unknown field "Recipient" (did you mean recipient?)`,
		"unknown_field.jsonl":      `unknown field "campaign" (fields: recipient, template, policy, provider, queue, data, idempotency_key, send_by, send_at, send_at_local, tz, tenant)`,
		"duplicate_field.jsonl":    `recipient: given twice`,
		"recipient_number.jsonl":   `recipient: must be a string (got number)`,
		"missing_recipient.jsonl":  `recipient: missing`,
		"empty_recipient.jsonl":    `recipient: missing`,
		"missing_template.jsonl":   `template: missing`,
		"long_recipient.jsonl":     `recipient: 262 bytes, longer than 256`,
		"data_array.jsonl":         `data: must be a JSON object (got array)`,
		"data_string.jsonl":        `data: must be a JSON object (got string)`,
		"send_by_words.jsonl":      `send_by: must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got "tomorrow")`,
		"send_by_number.jsonl":     `send_by: must be a string (got number)`,
		"send_by_past.jsonl":       `send_by: 2001-09-09T01:46:40Z is in the past`,
		"unknown_tz.jsonl":         `tz: unknown time zone "America/Nowhere" (an IANA zone such as Europe/Paris)`,
		"tz_number.jsonl":          `tz: must be a string (got number)`,
		"tenant_number.jsonl":      `tenant: must be a string (got number)`,
		"long_tenant.jsonl":        `tenant: 257 bytes, longer than 256`,
		"tenant_control.jsonl":     `tenant: control character U+0000 (byte 5)`,
		"recipient_control.jsonl":  `recipient: control character U+0000 (byte 2)`,
		"misspelled_policy.jsonl":  `policy "marketng" is not defined in testdata/config.yaml (did you mean marketing?)`,
		"undefined_policy.jsonl":   `policy "vip" is not defined in testdata/config.yaml (defined: marketing, transactional)`,
		"undefined_provider.jsonl": `provider "pigeon" is not defined in testdata/config.yaml (defined: console, sms)`,
		"undefined_queue.jsonl":    `queue "bulk" is not defined in testdata/config.yaml (defined: critical, default, low)`,
		"key_number.jsonl":         `idempotency_key: must be a string (got number)`,
		"not_utf8.jsonl":           `not UTF-8 (byte 16)`,
	}
	files, err := filepath.Glob("testdata/bad/*.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := tests[filepath.Base(f)]; !ok {
			t.Errorf("%s has no expected message here", f)
		}
	}
	for name, msg := range tests {
		t.Run(strings.TrimSuffix(name, ".jsonl"), func(t *testing.T) {
			path := "testdata/bad/" + name
			out := h.runArgs("-file", path)
			want := path + ":1: " + msg + "\nenqueued 0, duplicates 0, rejected 1 (1 lines)\n"
			if out.code != 1 || out.stdout != "" || out.stderr != want {
				t.Errorf("enqueue = %d, stdout %q, stderr:\n%s\nwant 1, nothing, stderr:\n%s", out.code, out.stdout, out.stderr, want)
			}
		})
	}
	wantPending(t, h, map[string]int{})
}

// TestLongLines checks the size limits at their edges: a line longer than
// message.MaxPayloadLen is rejected without being held, and a line within it
// whose payload is larger (JSON escapes "<" as \u003c) is rejected too.
func TestLongLines(t *testing.T) {
	h := newHarness(t)
	// line returns a line of exactly size bytes (without its line break).
	line := func(recipient string, size int) string {
		l := fmt.Sprintf(`{"recipient":%q,"template":"t","data":{"p":""}}`, recipient)
		return l[:len(l)-3] + strings.Repeat("x", size-len(l)) + l[len(l)-3:]
	}
	max := message.MaxPayloadLen
	escaped := `{"recipient":"e@example.com","template":"t","data":{"p":"` + strings.Repeat("<", 11000) + `"}}`
	edge := line("f@example.com", max)
	lines := []string{
		line("a@example.com", 100),
		line("b@example.com", 1<<20),
		line("c@example.com", max-100),
		escaped,
		edge,
		line("g@example.com", max+1),
		line("h@example.com", max+2),
		`{"recipient":"i@example.com","template":"t"}`,
	}
	data := strings.Join(lines, "\r\n") + "\r\n"
	path := filepath.Join(t.TempDir(), "long.jsonl")
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	out := h.runArgs("-file", path)
	// The line of 11000 '<' is enqueued: payloads are encoded without HTML
	// escaping, so it does not grow to six bytes per '<' past the limit.
	edgeLen := len(edge) + len(`,"policy":"marketing","provider":"console","queued_at":"2006-01-02T15:04:05Z"`)
	want := fmt.Sprintf(`%[1]s:2: line of 1048576 bytes, more than 65536
%[1]s:5: data: %[3]d bytes, too much: the task's payload of %[2]d bytes, more than 65536 (message.MaxPayloadLen)
%[1]s:6: line of 65537 bytes, more than 65536
%[1]s:7: line of 65538 bytes, more than 65536
enqueued 4, duplicates 0, rejected 4 (8 lines)
`, path, edgeLen, len(edge)-len(`{"recipient":"f@example.com","template":"t","data":}`))
	if out.code != 1 || out.stderr != want {
		t.Fatalf("enqueue = %d, stderr:\n%s\nwant 1, stderr:\n%s", out.code, out.stderr, want)
	}
	var got []string
	for _, n := range h.pendingTasks("default") {
		got = append(got, n.Recipient)
		if n.Recipient == "e@example.com" && string(n.Data) != `{"p":"`+strings.Repeat("<", 11000)+`"}` {
			t.Errorf("the '<' line's data came back as %.40q...", n.Data)
		}
	}
	slices.Sort(got)
	if want := []string{"a@example.com", "c@example.com", "e@example.com", "i@example.com"}; !slices.Equal(got, want) {
		t.Errorf("enqueued %v, want %v", got, want)
	}
}

// TestInterrupted cancels the context while enqueue waits for more of
// stdin: it stops and says where to resume.
func TestInterrupted(t *testing.T) {
	h := newHarness(t)
	r, w := io.Pipe()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan outcome)
	go func() {
		done <- h.run(invocation{ctx: ctx, args: []string{"-config", testConfig, "-file", "-"}, stdin: r})
	}()
	if _, err := io.WriteString(w, `{"recipient":"a@example.com","template":"t"}`+"\n\n"+`{"template":"t"}`+"\n"+`{"recipient":"b@example.com","template":"t"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	waitPending(t, h, 2)
	cancel()
	out := <-done
	want := `stdin:3: recipient: missing
enqueue: interrupted (context canceled)
enqueue: stopped: lines 1-4 are done, 2 enqueued; resume from line 5
enqueued 2, duplicates 0, rejected 1 (4 lines)
`
	if out.code != 1 || out.stderr != want {
		t.Errorf("enqueue = %d, stderr:\n%s\nwant 1, stderr:\n%s", out.code, out.stderr, want)
	}
}

// TestProgress checks that the progress bar is drawn on a terminal only,
// and that it leaves the reports and the summary whole.
func TestProgress(t *testing.T) {
	const want = `testdata/mixed.jsonl:3: policy "vip" is not defined in testdata/config.yaml (defined: marketing, transactional)
testdata/mixed.jsonl:6: recipient: missing
enqueued 4, duplicates 0, rejected 2 (8 lines)
`
	args := []string{"-config", testConfig, "-file", "testdata/mixed.jsonl"}
	plain := newHarness(t).run(invocation{args: args})
	if plain.stderr != want {
		t.Errorf("not a terminal: stderr %q, want %q", plain.stderr, want)
	}
	tty := newHarness(t).run(invocation{args: args, terminal: true})
	if !bar.MatchString(tty.stderr) {
		t.Errorf("terminal: no progress bar in %q", tty.stderr)
	}
	// Without the bar and the erasing of it, the output is as without a terminal.
	if rest := strings.ReplaceAll(bar.ReplaceAllString(tty.stderr, ""), "\r\033[K", ""); rest != want {
		t.Errorf("terminal: stderr without the bar = %q, want %q (stderr %q)", rest, want, tty.stderr)
	}
}

var bar = regexp.MustCompile(`\r\033\[K *\d+% \[[#.]{24}\] line \d+  enqueued \d+  rejected \d+(  \d+ lines/s)?`)

// waitPending waits until n tasks are pending in queue default.
func waitPending(t *testing.T, h *harness, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := h.insp.GetQueueInfo("default")
		if err == nil && info.Pending == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d pending tasks: %v, %v", n, info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
