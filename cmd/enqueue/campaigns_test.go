package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/campaign"
)

const campaignConfig = "testdata/campaigns.yaml"

func TestCampaignsList(t *testing.T) {
	// No harness: listing reads only the config, so it works with Redis down.
	out := (*harness)(nil).run(invocation{args: []string{"-config", campaignConfig, "-campaigns"}})
	if out.code != exitOK || out.stderr != "" {
		t.Fatalf("exit %d, stderr %q", out.code, out.stderr)
	}
	lines := strings.Split(strings.TrimRight(out.stdout, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "CAMPAIGN") {
		t.Fatalf("want a header and 2 campaigns, got:\n%s", out.stdout)
	}
	digest := regexp.MustCompile(`^digest\s+0 9 \* \* MON\s+Europe/Paris\s+file \S*audience.txt\s+default\s+(\S+), (\S+), (\S+)$`)
	m := digest.FindStringSubmatch(lines[1])
	if m == nil {
		t.Fatalf("digest line %q does not match %s", lines[1], digest)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	prev := time.Now()
	for _, s := range m[1:] {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatalf("next time %q: %v", s, err)
		}
		local := tm.In(paris)
		if local.Weekday() != time.Monday || local.Hour() != 9 || local.Minute() != 0 || !tm.After(prev) {
			t.Errorf("next time %s (%s in Paris) is not the next Monday 09:00 after %s", s, local, prev)
		}
		prev = tm
	}
	if !regexp.MustCompile(`^ping\s+@every 10m\s+UTC\s+redis set \S+\s+low\s+`).MatchString(lines[2]) {
		t.Errorf("ping line %q", lines[2])
	}
}

func TestCampaignTrigger(t *testing.T) {
	h := newHarness(t)
	out := h.run(invocation{args: []string{"-config", campaignConfig, "-trigger", "digest"}})
	if out.code != exitOK {
		t.Fatalf("exit %d, stderr %q", out.code, out.stderr)
	}
	tick := strings.TrimSpace(out.stdout)
	if !regexp.MustCompile(`^digest@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`).MatchString(tick) {
		t.Fatalf("stdout %q is not a tick", out.stdout)
	}
	at, _ := time.Parse(time.RFC3339, strings.TrimPrefix(tick, "digest@"))
	id := campaign.NewTick("digest", at).TaskID()
	info, err := h.insp.GetTaskInfo("default", id)
	if err != nil {
		t.Fatalf("fan-out task %s not in queue default: %v", id, err)
	}
	if info.Type != campaign.TypeFanout {
		t.Errorf("task type %q, want %q", info.Type, campaign.TypeFanout)
	}

	// The same second again is the same tick: reported, not fired twice.
	// (Retry until a trigger lands in the same second as the first one.)
	for range 5 {
		again := h.run(invocation{args: []string{"-config", campaignConfig, "-trigger", "digest"}})
		if strings.TrimSpace(again.stdout) != tick {
			continue // a new second: a new tick, which is right
		}
		if again.code != exitOK || !strings.Contains(again.stderr, "has fired already") {
			t.Fatalf("same-second trigger: exit %d, stderr %q", again.code, again.stderr)
		}
		break
	}
}

func TestCampaignTriggerUnknown(t *testing.T) {
	h := newHarness(t)
	out := h.run(invocation{args: []string{"-config", campaignConfig, "-trigger", "nope"}})
	want := "enqueue: campaign \"nope\" is not defined in testdata/campaigns.yaml (enqueue -campaigns lists them)\n"
	if out.code != exitRejected || out.stderr != want {
		t.Fatalf("exit %d, stderr %q; want 1, %q", out.code, out.stderr, want)
	}
	if n := h.pending(); len(n) != 0 {
		t.Errorf("something was enqueued: %v", n)
	}
}

func TestCampaignFlagsExclusive(t *testing.T) {
	out := (*harness)(nil).run(invocation{args: []string{"-config", campaignConfig, "-campaigns", "-file", "x.jsonl"}})
	if out.code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr %q", out.code, exitUsage, out.stderr)
	}
}
