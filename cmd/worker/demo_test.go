package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoRunsBesideTakenPorts: with the configured HTTP address and
// embedded Redis address taken (another worker, another demo), the demo
// serves on free ports, says where, and runs to its end instead of exiting
// at once.
func TestDemoRunsBesideTakenPorts(t *testing.T) {
	out, taken := runDemoBesideTakenPorts(t, "1s")
	for i, what := range []string{"serving /healthz, /metrics and the dashboard on 127.0.0.1:", "the embedded Redis listens on 127.0.0.1:"} {
		if !strings.Contains(out, "demo: "+taken[i]+" is taken: "+what) {
			t.Errorf("the demo did not say where it went instead of %s (%s...):\n%s", taken[i], what, out)
		}
	}
	if !strings.Contains(out, "demo: dashboard at http://127.0.0.1:") || strings.Contains(out, "dashboard at http://"+taken[0]) {
		t.Errorf("the demo's dashboard line does not name its new address:\n%s", out)
	}
	if !strings.Contains(out, "Each recipient's sends") {
		t.Errorf("the demo did not run to its end:\n%s", out)
	}
}

// TestDemoShowsAScheduledMessageAndItsEvents: the demo's message through
// the API is scheduled a few seconds ahead, waits, is sent at its moment,
// and its events reach the demo's receiver, which verifies each.
func TestDemoShowsAScheduledMessageAndItsEvents(t *testing.T) {
	// Long enough for the scheduled message to go behind the provider's
	// line: in 8 s it was once booked, 13 ahead of it at 2/s, for 9.6 s.
	out, _ := runDemoBesideTakenPorts(t, "15s")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`-> 202 Accepted: id [0-9a-f-]+, scheduled until [0-9.]+s`),
		regexp.MustCompile(`sent +erin@example.com +#1 \(the scheduled one, at its moment\)`),
		regexp.MustCompile(`it verified [0-9]+ \(lifecycle.Verify\) and refused 0`),
		regexp.MustCompile(`(?s)The scheduled message's events \(erin@example.com\), as the receiver verified them:\n` +
			` +[0-9.]+s  accepted  via api, key demo-erin-welcome\n +[0-9.]+s  scheduled for [0-9.]+s\n` +
			`( +[0-9.]+s  booked    for [0-9.]+s, by provider demo .*\n)?` + // the provider may be busy at its moment
			` +[0-9.]+s  sent      provider demo\n`),
	} {
		if !want.MatchString(out) {
			t.Errorf("the demo's output does not match %s:\n%s", want, out)
		}
	}
}

// runDemoBesideTakenPorts runs the demo for d with its configured HTTP
// and embedded Redis addresses taken (which it moves to free ports: the
// tests' ports are never another test's), and returns its output and the
// two addresses.
func runDemoBesideTakenPorts(t *testing.T, d string) (string, [2]string) {
	t.Helper()
	var taken [2]string
	for i := range taken {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		taken[i] = ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "demo.yaml")
	yaml := "redis: {url: embedded, embedded_addr: \"" + taken[1] + "\"}\nworker: {http_addr: \"" + taken[0] + "\"}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr lockedBuffer // the demo prints from the handlers' goroutines too
	if err := run(ctx, []string{"-config", path, "-demo", d}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	return stdout.String(), taken
}
