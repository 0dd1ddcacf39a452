//go:build integration

package integration_test

// A chaos run's deliveries over time, and what the workers logged while
// none came: the run is judged on its arrivals, and a stretch without any
// is what a slow run shows first.

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// chaosLogs, if set, is a directory where each chaos run keeps every
// worker process's whole log and the webhook's arrivals, for a run whose
// gap or failure the test's own output does not explain.
var chaosLogs = flag.String("chaos-logs", "", "keep each chaos run's worker logs and arrivals in this directory")

// chaosGap is how long a run may go without a delivery before its
// deliveries are logged second by second, with what the workers logged
// meanwhile. A quiet run delivers every second.
const chaosGap = 5 * time.Second

// gapLines is how many of a worker process's log lines from a gap are
// logged as they are; the rest are counted by message.
const gapLines = 40

// firsts returns the time of each task's first acceptance, in order.
func firsts(arrivals []arrival) []time.Time {
	var times []time.Time
	seen := map[string]bool{}
	for _, a := range arrivals {
		if a.Status == http.StatusOK && !seen[a.Key] {
			seen[a.Key] = true
			times = append(times, a.At)
		}
	}
	return sortedTimes(times)
}

// perSecond counts the deliveries in each second from the start and names
// the longest stretch without one.
func (c *chaos) perSecond(arrivals []arrival) string {
	times := firsts(arrivals)
	var counts []int
	for _, at := range times {
		i := max(0, int(at.Sub(c.start)/time.Second))
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	from, gap := c.longestGap(times)
	return fmt.Sprintf("delivered per second from the start: %v; longest stretch without a delivery %s from %s in",
		counts, gap.Round(time.Millisecond), from.Sub(c.start).Round(time.Millisecond))
}

// longestGap returns the longest stretch between the start and the
// deliveries, or between two of them: where it began and how long it was.
func (c *chaos) longestGap(times []time.Time) (from time.Time, gap time.Duration) {
	prev := c.start
	for _, at := range times {
		if d := at.Sub(prev); d > gap {
			from, gap = prev, d
		}
		prev = at
	}
	return from, gap
}

// logTimeline logs the deliveries per 10 s; when the run failed or went
// longer than chaosGap without a delivery, per second too, with what every
// worker process logged in the longest gap.
func (c *chaos) logTimeline(t *testing.T, arrivals []arrival) {
	t.Helper()
	times := firsts(arrivals)
	var per10s []int
	for _, at := range times {
		i := max(0, int(at.Sub(c.start)/(10*time.Second)))
		for len(per10s) <= i {
			per10s = append(per10s, 0)
		}
		per10s[i]++
	}
	var killed []time.Duration
	for _, k := range c.killed {
		killed = append(killed, k.from.Sub(c.start).Round(100*time.Millisecond))
	}
	t.Logf("delivered per 10 s from the start: %v; workers killed at %v", per10s, killed)
	from, gap := c.longestGap(times)
	if gap <= chaosGap && !t.Failed() {
		return
	}
	t.Logf("%s", c.perSecond(arrivals))
	for _, w := range c.procs {
		t.Logf("--- worker %s (pid %d) logged from %s to %s in ---\n%s", w.name, w.cmd.Process.Pid,
			from.Sub(c.start).Round(time.Millisecond), from.Add(gap).Sub(c.start).Round(time.Millisecond),
			logsWithin(w.out.String(), from.Add(-time.Second), from.Add(gap)))
	}
	// The message that ended the gap, and what every worker logged of it.
	for _, a := range arrivals {
		if a.Status == http.StatusOK && a.At.Equal(from.Add(gap)) {
			t.Logf("--- the gap ended with task %s from %s; its story ---\n%s", a.Key, a.Worker, c.story(a.Key))
		}
	}
}

// story returns every worker process's log lines that name task id, each
// after the name and pid of the process.
func (c *chaos) story(id string) string {
	var lines []string
	for _, w := range c.procs {
		for _, line := range strings.Split(w.out.String(), "\n") {
			if strings.Contains(line, id) {
				lines = append(lines, fmt.Sprintf("%s/%d: %s", w.name, w.cmd.Process.Pid, line))
			}
		}
	}
	return strings.Join(lines, "\n")
}

// logTime and logMsg read a worker's slog line (the text handler's).
var (
	logTime = regexp.MustCompile(`^time=(\S+)`)
	logMsg  = regexp.MustCompile(` msg=("(?:[^"\\]|\\.)*"|\S+)`)
)

// logsWithin returns the lines of a worker's log stamped from from to to:
// the first gapLines as they are, then how many of each message the rest
// held.
func logsWithin(out string, from, to time.Time) string {
	var kept []string
	counts := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(from) || at.After(to) {
			continue
		}
		if len(kept) < gapLines {
			kept = append(kept, line)
			continue
		}
		msg := "?"
		if mm := logMsg.FindStringSubmatch(line); mm != nil {
			msg = mm[1]
		}
		counts[msg]++
	}
	var rest []string
	for msg, n := range counts {
		rest = append(rest, fmt.Sprintf("%d× %s", n, msg))
	}
	slices.Sort(rest)
	if len(rest) > 0 {
		kept = append(kept, "and then: "+strings.Join(rest, ", "))
	}
	return strings.Join(kept, "\n")
}

// keepLogs writes every worker process's log and the arrivals into a
// directory of chaosLogs named for the test, if chaosLogs is set.
func (c *chaos) keepLogs(t *testing.T) {
	t.Helper()
	if *chaosLogs == "" {
		return
	}
	dir := filepath.Join(*chaosLogs, strings.NewReplacer("/", "_", "=", "", ",", "_").Replace(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for i, w := range c.procs {
		files[fmt.Sprintf("%02d-%s-%d.log", i, w.name, w.cmd.Process.Pid)] = []byte(w.out.String())
	}
	js, err := json.Marshal(c.f.hook.snapshot())
	if err != nil {
		t.Fatal(err)
	}
	files["arrivals.json"] = js
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("worker logs and arrivals kept in %s", dir)
}
