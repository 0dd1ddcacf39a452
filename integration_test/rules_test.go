//go:build integration

package integration_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
)

// ruleFleet starts one worker binary with cfg's policies and provider
// settings, a webhook that accepts everything, booking on, and, unless cfg
// says, a provider of 100/s burst 10; and a client to enqueue with.
func ruleFleet(t *testing.T, cfg fleetConfig) (*fleet, *workerProc, *asynq.Client) {
	t.Helper()
	cfg.Concurrency, cfg.ShutdownTimeout, cfg.InlineWait, cfg.Book = 4, 5*time.Second, time.Second, true
	if cfg.Rate == 0 {
		cfg.Rate, cfg.Burst = 100, 10
	}
	f := newFleet(t, cfg, func(arrival, int) hookAnswer { return hookAnswer{} })
	w := f.startWorker("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	t.Cleanup(func() { client.Close() })
	return f, w, client
}

// TestOverCapThroughTheWorker runs the worker binary with a policy that
// drops and one that defers with a max delay: of three messages to one
// recipient on the first, one is sent and two are archived as dropped, with
// the reason and counted; of two to another on the second, one is sent and
// the other expires, saying it is the max delay.
func TestOverCapThroughTheWorker(t *testing.T) {
	f, w, client := ruleFleet(t, fleetConfig{
		Policy:       "{windows: [{limit: 1, per: 1h}], over_cap: drop}",
		MorePolicies: "\n  slow: {windows: [{limit: 1, per: 1h}], max_delay: 10m}",
	})
	first := f.enqueue(client, "drop-0", message.Notification{Recipient: "alice@example.com", Template: "promo"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 1 })
	dropped := []string{
		f.enqueue(client, "drop-1", message.Notification{Recipient: "alice@example.com", Template: "promo"}),
		f.enqueue(client, "drop-2", message.Notification{Recipient: "alice@example.com", Template: "promo"}),
	}
	sent := f.enqueue(client, "slow-0", message.Notification{Recipient: "bob@example.com", Policy: "slow", Template: "news"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 2 })
	late := f.enqueue(client, "slow-1", message.Notification{Recipient: "bob@example.com", Policy: "slow", Template: "news"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 2 && q.Archived == 3 })

	got := f.hook.delivered()
	if len(got) != 2 || got[first] != 1 || got[sent] != 1 {
		t.Errorf("webhook got %v, want %s and %s once each", got, first, sent)
	}
	archived := f.archived()
	for _, id := range dropped {
		if a := archived[id]; a == nil || a.LastErr != "dropped: over policy pace (1 per 1h): skip retry for the task" {
			t.Errorf("%s archived as %+v, want dropped over policy pace (1 per 1h)", id, a)
		}
	}
	re := regexp.MustCompile(`^expired: max_delay 10m of policy slow \(until \S+\) passed before policy slow \(1 per 1h\) would allow it`)
	if a := archived[late]; a == nil || !re.MatchString(a.LastErr) {
		t.Errorf("%s archived as %+v, want it expired by slow's max_delay", late, a)
	}
	m := f.metricsOf(w)
	if n := m[`throttler_dropped_total{policy="pace"}`]; n != 2 {
		t.Errorf("throttler_dropped_total{policy=\"pace\"} = %v, want 2", n)
	}
	if n := m[`throttler_expired_total{policy="slow"}`]; n != 1 {
		t.Errorf("throttler_expired_total{policy=\"slow\"} = %v, want 1", n)
	}
}

// TestCountOnlyThroughTheWorker runs the worker binary with a reset policy
// that counts toward pace: resets to a recipient whose pace cap is full are
// sent, and a pace message after a reset is held back by pace.
func TestCountOnlyThroughTheWorker(t *testing.T) {
	f, _, client := ruleFleet(t, fleetConfig{
		Policy:       "[{limit: 1, per: 1h}]",
		MorePolicies: "\n  reset: {windows: [{limit: 5, per: 1h}], counts_toward: [pace]}",
	})
	promo := f.enqueue(client, "alice-promo", message.Notification{Recipient: "alice@example.com", Template: "promo"})
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 1 })
	resets := []string{
		f.enqueue(client, "alice-reset-1", message.Notification{Recipient: "alice@example.com", Policy: "reset", Template: "reset"}),
		f.enqueue(client, "alice-reset-2", message.Notification{Recipient: "alice@example.com", Policy: "reset", Template: "reset"}),
		f.enqueue(client, "bob-reset", message.Notification{Recipient: "bob@example.com", Policy: "reset", Template: "reset"}),
	}
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 4 })
	held := f.enqueue(client, "bob-promo", message.Notification{Recipient: "bob@example.com", Template: "promo"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := f.insp.GetTaskInfo(fleetQueue, held)
		if err == nil && info.State == asynq.TaskStateScheduled || err == nil && info.State == asynq.TaskStateRetry {
			if !regexp.MustCompile(`policy pace \(1 per 1h\)`).MatchString(info.LastErr) {
				t.Errorf("bob's promo is waiting for %q, want policy pace (1 per 1h)", info.LastErr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's promo never deferred: %+v, %v", info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := f.hook.delivered()
	for _, id := range append(resets, promo) {
		if got[id] != 1 {
			t.Errorf("webhook got %s %d times, want once (all sent: %v)", id, got[id], got)
		}
	}
	if got[held] != 0 {
		t.Errorf("bob's promo was sent after a reset that counts toward pace")
	}
}

// TestShadowThroughTheWorker runs the worker binary with its policy and its
// provider in shadow mode: every message goes at once, although the policy
// allows one an hour and the provider one per 100 s, and the metrics count
// what each would have held back.
func TestShadowThroughTheWorker(t *testing.T) {
	f, w, client := ruleFleet(t, fleetConfig{
		Policy: "{windows: [{limit: 1, per: 1h}], over_cap: drop, shadow: true}",
		Rate:   0.01, Burst: 1,
		ProviderMore: "\n    shadow: true",
	})
	var ids []string
	for i, to := range []string{"alice@example.com", "alice@example.com", "alice@example.com", "bob@example.com"} {
		ids = append(ids, f.enqueue(client, fmt.Sprintf("shadow-%d", i), message.Notification{Recipient: to, Template: "promo"}))
		f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == i+1 })
	}
	got := f.hook.delivered()
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("webhook got %s %d times, want once (all: %v)", id, got[id], got)
		}
	}
	m := f.metricsOf(w)
	for key, want := range map[string]float64{
		`throttler_shadow_total{rule="policy pace (1 per 1h)",would="dropped"}`:          2,
		`throttler_shadow_total{rule="provider hook (0.01/s burst 1)",would="deferred"}`: 3,
	} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v", key, m[key], want)
		}
	}
}

// TestReloadThroughTheWorker sends the worker binary SIGHUP after changing
// its config file: a tighter limit applies at once to the history already
// in Redis; a file with a mistake is refused with file:line: path: message
// and the running config stays; a policy removed leaves its messages
// archived with the reason.
func TestReloadThroughTheWorker(t *testing.T) {
	f, w, client := ruleFleet(t, fleetConfig{
		Policy:       "[{limit: 5, per: 1h}]",
		MorePolicies: "\n  promo: [{limit: 5, per: 1h}]",
	})
	path := filepath.Join(f.dir, w.name+".yaml")
	reload := func(policy, more string, logged string) {
		t.Helper()
		f.cfg.Policy, f.cfg.MorePolicies = policy, more
		if got := f.writeConfig(w.name, w.metrics); got != path {
			t.Fatalf("config written to %s, want %s", got, path)
		}
		before := strings.Count(w.out.String(), logged)
		if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); strings.Count(w.out.String(), logged) == before; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the worker's log after SIGHUP", logged)
			}
		}
	}
	send := func(key, to, policy string) string {
		t.Helper()
		return f.enqueue(client, key, message.Notification{Recipient: to, Policy: policy, Template: "news"})
	}
	until := func(what string, done func(q asynq.QueueInfo) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !done(f.queueState()); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %+v", what, f.queueState())
			}
		}
	}
	completed := func(n int) {
		t.Helper()
		until(fmt.Sprintf("%d completed", n), func(q asynq.QueueInfo) bool { return q.Completed == n })
	}
	waiting := func(id, reason string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			info, err := f.insp.GetTaskInfo(fleetQueue, id)
			if err == nil && info.State == asynq.TaskStateRetry {
				if !strings.HasPrefix(info.LastErr, reason) {
					t.Errorf("%s waits for %q, want %q", id, info.LastErr, reason)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never deferred: %+v, %v", id, info, err)
			}
		}
	}

	send("a1", "alice@example.com", "")
	send("a2", "alice@example.com", "")
	completed(2)
	reload("[{limit: 2, per: 1h}]", "\n  promo: [{limit: 5, per: 1h}]", "config reloaded")
	waiting(send("a3", "alice@example.com", ""), "booked for ")
	if info, _ := f.insp.GetTaskInfo(fleetQueue, message.TaskID("a3")); info != nil && !strings.Contains(info.LastErr, "policy pace (2 per 1h)") {
		t.Errorf("a3 waits for %q, want policy pace (2 per 1h)", info.LastErr)
	}

	reload("[{limit: 0, per: 1h}]", "", "config reload refused")
	if want := path + ":15: policies.pace[0].limit: must be > 0 (got 0)"; !strings.Contains(w.out.String(), want) {
		t.Errorf("the refused reload did not log %q:\n%s", want, tail(w.out.String(), 10))
	}
	send("p1", "bob@example.com", "promo") // promo is still there
	completed(3)

	reload("[{limit: 2, per: 1h}]", "", "config reloaded")
	gone := send("p2", "carol@example.com", "promo")
	until("1 archived", func(q asynq.QueueInfo) bool { return q.Archived == 1 })
	if a := f.archived()[gone]; a == nil || !strings.HasPrefix(a.LastErr, `malformed notification: policy "promo" is not defined`) {
		t.Errorf("a promo after promo was removed: %+v, want archived, policy not defined", a)
	}
}
