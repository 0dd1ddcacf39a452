//go:build integration

package integration_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestDigestKill9 runs over_cap: digest through worker binaries, with one
// killed (kill -9) while it holds requests at the provider, folds and
// digests among them: every message reaches its recipient through exactly
// one carrier, its own send or one digest (a carrier sent twice, the
// provider's Idempotency-Key window, is still one), none both; a digest
// carries only its recipient's messages; and every task ends.
func TestDigestKill9(t *testing.T) {
	t.Parallel() // no bound a busy core breaks: it runs beside the chaos runs
	t.Run("mid-send of a message", func(t *testing.T) {
		digestKill9(t, func(a arrival, fromW1 int) bool { return fromW1 > 4 })
	})
	t.Run("mid-send of a digest", func(t *testing.T) {
		digestKill9(t, func(a arrival, _ int) bool { return a.Template == "digest" })
	})
}

// digestKill9 runs TestDigestKill9 with w1's requests that hold says held
// at the provider until w1 is killed.
func digestKill9(t *testing.T, hold func(a arrival, fromW1 int) bool) {
	const (
		recipients = 8
		per        = 5
		inFlight   = 2 // kill w1 once this many of its requests are held
	)
	cfg := fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: time.Second, Jitter: 200 * time.Millisecond,
		Policy: "{windows: [{limit: 1, per: 3s}], over_cap: digest}",
		Rate:   50, Burst: 10, Book: true,
		ACL: true, // digests' WATCH/MULTI/EXEC and list reads, as config.yaml's user
	}
	release := make(chan struct{})
	fromW1 := 0
	f := newFleet(t, cfg, func(a arrival, seq int) hookAnswer {
		if a.Worker != "w1" {
			return hookAnswer{}
		}
		if fromW1++; !hold(a, fromW1) {
			return hookAnswer{}
		}
		return hookAnswer{Hold: release}
	})
	notes := f.enqueueNotes("digest", recipients, per, 0, 0)
	w1 := f.startWorker("w1")
	held := func() int {
		n := 0
		for _, a := range f.hook.snapshot() {
			if a.Worker == "w1" && a.Status == 0 {
				n++
			}
		}
		return n
	}
	// Killed before its held requests time out (5 s): what they carry is
	// the kill's, not a timeout's (a send that failed is never folded).
	waitFor(t, fmt.Sprintf("w1 to have %d requests held", inFlight), func() bool { return held() >= inFlight })
	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !w1.wait(10 * time.Second) {
		t.Fatal("w1 still running 10 s after SIGKILL")
	}
	close(release) // the provider accepts them; w1 never hears it
	f.startWorker("w2")

	// carriers returns, per message, the distinct carriers the provider
	// accepted it in: its own ID, or a digest's.
	carriers := func() map[string][]string {
		got := map[string][]string{}
		add := func(id, carrier string) {
			if !slices.Contains(got[id], carrier) {
				got[id] = append(got[id], carrier)
			}
		}
		for _, a := range f.hook.snapshot() {
			if a.Status < 200 || a.Status > 299 {
				continue
			}
			if a.Template != "digest" {
				add(a.Key, a.Key)
				continue
			}
			var d struct{ Messages []struct{ ID string } }
			if err := json.Unmarshal(a.Data, &d); err != nil {
				t.Fatalf("digest %s: %v", a.Key, err)
			}
			for _, m := range d.Messages {
				if n, ok := notes[m.ID]; !ok || n.recipient != a.Recipient {
					t.Errorf("digest %s to %s carries %s, not one of its recipient's messages", a.Key, a.Recipient, m.ID)
				}
				add(m.ID, "digest "+a.Key)
			}
		}
		return got
	}
	q := f.waitSettled(90*time.Second, func(asynq.QueueInfo) bool { return len(carriers()) == len(notes) })
	got := carriers()
	digests, direct := map[string]bool{}, 0
	for id := range notes {
		switch c := got[id]; {
		case len(c) != 1:
			t.Errorf("message %s reached its recipient through %v, want exactly one carrier", id, c)
		case c[0] == id:
			direct++
		default:
			digests[c[0]] = true
		}
	}
	if q.Archived != 0 {
		t.Errorf("%d tasks archived, want none: %v", q.Archived, f.archived())
	}
	if len(digests) == 0 || direct < recipients {
		t.Errorf("%d sent on their own, %d digests: want each recipient's first alone and digests for the rest", direct, len(digests))
	}
	t.Logf("%d messages: %d sent on their own, the rest in %d digests", len(notes), direct, len(digests))
}

// TestDigestGoesAtTheFirstMomentAfterItsFolds is issue 28's fifth scenario
// through worker binaries: four messages to one recipient under 1 per 20 s
// with over_cap: digest, taken by two workers at once. One is sent, three
// fold, and their digest reaches the provider at the first moment the
// policy allows after the message sent (a window and worker.window_margin
// later, give or take asynq's seconds), not a window
// after that: a fold that kept a booking of its own made the next fold find
// the moment taken, and the digest went 40 s after the message.
func TestDigestGoesAtTheFirstMomentAfterItsFolds(t *testing.T) {
	const per, margin = 20 * time.Second, 250 * time.Millisecond // the policy's window, config.yaml's margin
	cfg := fleetConfig{
		Concurrency: 4, ShutdownTimeout: 5 * time.Second, InlineWait: 2500 * time.Millisecond, Jitter: time.Second,
		Policy: "{windows: [{limit: 1, per: 20s}], over_cap: digest}",
		Rate:   50, Burst: 10, Book: true,
		ACL: true, // digests' WATCH/MULTI/EXEC and list reads, as config.yaml's user
	}
	f := newFleet(t, cfg, nil)
	notes := f.enqueueNotes("fold", 1, 4, 0, 0)
	f.startWorkers("w1", "w2")
	var sent, digests []arrival
	q := f.waitSettled(per+time.Minute, func(asynq.QueueInfo) bool {
		sent, digests = nil, nil
		for _, a := range f.hook.snapshot() {
			switch {
			case a.Status < 200 || a.Status > 299:
			case a.Template == "digest":
				digests = append(digests, a)
			default:
				sent = append(sent, a)
			}
		}
		return len(digests) > 0
	})
	if q.Archived != 0 {
		t.Errorf("%d tasks archived, want none: %v", q.Archived, f.archived())
	}
	if len(sent) != 1 || len(digests) != 1 {
		t.Fatalf("%d messages sent on their own and %d digests, want 1 and 1", len(sent), len(digests))
	}
	var d struct{ Messages []struct{ ID string } }
	if err := json.Unmarshal(digests[0].Data, &d); err != nil {
		t.Fatalf("digest %s: %v", digests[0].Key, err)
	}
	carried := map[string]bool{sent[0].Key: true}
	for _, m := range d.Messages {
		carried[m.ID] = true
	}
	for id := range notes {
		if !carried[id] {
			t.Errorf("message %s reached its recipient neither on its own nor in the digest", id)
		}
	}
	gap := digests[0].At.Sub(sent[0].At)
	t.Logf("the digest of %d arrived %s after the message sent", len(d.Messages), gap.Round(time.Millisecond))
	// asynq keeps the digest's moment to the second and its forwarder looks
	// every second: up to 2 s, and the dequeue.
	if latest := per + margin + 2500*time.Millisecond; gap < per || gap > latest {
		t.Errorf("the digest arrived %s after the message sent, want from %s (the window) to %s (the first moment it allows, its margin, asynq's seconds); a window late is %s",
			gap.Round(time.Millisecond), per, latest, 2*per)
	}
}
