package jobs

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/screen"
	"github.com/notify-throttle/throttler/throttle"
)

// scopedFake is a Scoper provider whose scopes are its sender and the
// (sender, recipient) pair, answering as answer says and counting sends.
type scopedFake struct {
	mu     sync.Mutex
	calls  map[string]int // by recipient
	sent   map[string]time.Time
	answer func(providers.Message) error
}

func newScopedFake(answer func(providers.Message) error) *scopedFake {
	return &scopedFake{calls: map[string]int{}, sent: map[string]time.Time{}, answer: answer}
}

func (f *scopedFake) Scopes(m providers.Message) []string {
	return []string{providers.SenderScope("+1000"), providers.PairScope("+1000", m.Recipient)}
}

func (f *scopedFake) Send(_ context.Context, m providers.Message) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[m.Recipient]++
	if err := f.answer(m); err != nil {
		return "", err
	}
	f.sent[m.ID] = time.Now()
	return "", nil
}

func (f *scopedFake) callsTo(r string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[r]
}

func (f *scopedFake) sentAt(id string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.sent[id]
	return at, ok
}

func newScopedHarness(t *testing.T, f *scopedFake) *harness {
	t.Helper()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 100, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	return newHarnessWith(t, harnessConfig{quota: q, bucket: b, provider: f, screen: true})
}

func TestScopedPauseHoldsOnlyItsPair(t *testing.T) {
	t.Parallel()
	var once sync.Once
	f := newScopedFake(func(m providers.Message) error {
		var err error
		if m.Recipient == "+2000" {
			once.Do(func() {
				err = &providers.SendError{Outcome: providers.Pause, RetryAfter: 3 * time.Second, Scope: providers.PairScope("+1000", "+2000"), Err: errString("14107")}
			})
		}
		return err
	})
	h := newScopedHarness(t, f)
	h.enqueue(t, "pair-1", message.Notification{Recipient: "+2000"})
	h.await(t, "pair-1", "deferred", state(asynq.TaskStateRetry))
	paused := time.Now()
	h.enqueue(t, "pair-2", message.Notification{Recipient: "+2000"})
	h.enqueue(t, "other", message.Notification{Recipient: "+3000"})
	h.await(t, "other", "completed", state(asynq.TaskStateCompleted))
	if since := time.Since(paused); since > 2*time.Second {
		t.Errorf("another pair waited %s: the pause held more than its pair", since)
	}
	info := h.await(t, "pair-2", "deferred", state(asynq.TaskStateRetry))
	if !strings.Contains(info.LastErr, "holds a scope") || info.Retried != 0 {
		t.Errorf("pair-2 during the pause: %q (retried %d)", info.LastErr, info.Retried)
	}
	if n := f.callsTo("+2000"); n != 1 {
		t.Errorf("the held pair was tried %d times during its pause, want 1", n)
	}
	for _, id := range []string{"pair-1", "pair-2"} {
		h.await(t, id, "completed", state(asynq.TaskStateCompleted))
		if at, _ := f.sentAt(id); at.Sub(paused) < 2900*time.Millisecond {
			t.Errorf("%s sent %s after the 3s pause began", id, at.Sub(paused))
		}
	}
}

// TestScopedPauseWokenOnTime: jobs deferred to the end of a scoped pause
// run at its end, woken by the fleet (the moment written to the
// millisecond), not at asynq's whole second after.
func TestScopedPauseWokenOnTime(t *testing.T) {
	t.Parallel()
	var once sync.Once
	var paused time.Time
	f := newScopedFake(func(m providers.Message) error {
		var err error
		once.Do(func() {
			paused = time.Now()
			err = &providers.SendError{Outcome: providers.Pause, RetryAfter: 2500 * time.Millisecond, Scope: providers.PairScope("+1000", "+2000"), Err: errString("14107")}
		})
		return err
	})
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 100, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, provider: f, screen: true, member: true, forwardEvery: time.Second})
	h.enqueue(t, "pair-1", message.Notification{Recipient: "+2000"})
	h.await(t, "pair-1", "deferred", state(asynq.TaskStateRetry))
	h.enqueue(t, "pair-2", message.Notification{Recipient: "+2000"})
	for _, id := range []string{"pair-1", "pair-2"} {
		h.await(t, id, "completed", state(asynq.TaskStateCompleted))
		at, _ := f.sentAt(id)
		if late := at.Sub(paused.Add(2500 * time.Millisecond)); late < -50*time.Millisecond || late > 500*time.Millisecond {
			t.Errorf("%s sent %v after the pause's end, want within a poll and a look of it", id, late)
		}
		h.mu.Lock()
		if runs := h.runs[id]; runs > 2 {
			t.Errorf("%s ran %d times: woken before the pause's end", id, runs)
		}
		h.mu.Unlock()
	}
}

func TestDeadAddressIsSuppressed(t *testing.T) {
	t.Parallel()
	f := newScopedFake(func(m providers.Message) error {
		if m.Recipient == "dead-token" {
			return &providers.SendError{Outcome: providers.Dead, Err: errString("404 UNREGISTERED")}
		}
		return nil
	})
	h := newScopedHarness(t, f)
	h.enqueue(t, "d1", message.Notification{Recipient: "dead-token"})
	info := h.await(t, "d1", "archived", state(asynq.TaskStateArchived))
	if !strings.HasPrefix(info.LastErr, "dead address: 404 UNREGISTERED") {
		t.Errorf("d1 archived with %q", info.LastErr)
	}
	h.enqueue(t, "d2", message.Notification{Recipient: "dead-token"})
	info = h.await(t, "d2", "archived", state(asynq.TaskStateArchived))
	if !strings.HasPrefix(info.LastErr, "suppressed by provider gw since ") || !strings.Contains(info.LastErr, ": 404 UNREGISTERED") {
		t.Errorf("d2 archived with %q", info.LastErr)
	}
	if n := f.callsTo("dead-token"); n != 1 {
		t.Errorf("the dead token was sent to %d times, want 1", n)
	}
	scr := screen.New(h.rdb, "")
	sups, err := scr.Suppressions(context.Background(), "gw")
	if err != nil || len(sups) != 1 || sups[0].Address != "dead-token" || sups[0].Reason != "404 UNREGISTERED" {
		t.Fatalf("suppressions: %+v, %v", sups, err)
	}
	if lifted, err := scr.Unsuppress(context.Background(), "gw", "dead-token"); !lifted || err != nil {
		t.Fatalf("unsuppress: %v, %v", lifted, err)
	}
	f.mu.Lock()
	f.answer = func(providers.Message) error { return nil }
	f.mu.Unlock()
	h.enqueue(t, "d3", message.Notification{Recipient: "dead-token"})
	h.await(t, "d3", "completed", state(asynq.TaskStateCompleted))
}

func TestRetryAtTheMomentTheProviderNames(t *testing.T) {
	t.Parallel()
	var reset time.Time
	var once sync.Once
	f := newScopedFake(func(m providers.Message) error {
		var err error
		once.Do(func() {
			reset = time.Now().Add(3 * time.Second).Truncate(time.Second)
			err = &providers.SendError{Outcome: providers.Pause, RetryAt: reset, Err: errString("Daily message quota exceeded")}
		})
		return err
	})
	h := newScopedHarness(t, f)
	h.enqueue(t, "q", message.Notification{Recipient: "a@example.com"})
	info := h.await(t, "q", "deferred", state(asynq.TaskStateRetry))
	if info.Retried != 0 || !strings.Contains(info.LastErr, "Daily message quota exceeded") {
		t.Errorf("deferral: %+v", info)
	}
	h.await(t, "q", "completed", state(asynq.TaskStateCompleted))
	if at, _ := f.sentAt("q"); at.Before(reset) {
		t.Errorf("sent %s before the reset", reset.Sub(at))
	}
}

func TestBrokenCredentialsPauseTheProvider(t *testing.T) {
	t.Parallel()
	f := newScopedFake(func(m providers.Message) error {
		return &providers.SendError{Outcome: providers.Broken, RetryAfter: time.Minute, Err: errString("401 Unauthorized")}
	})
	h := newScopedHarness(t, f)
	h.enqueue(t, "b", message.Notification{Recipient: "x"})
	info := h.await(t, "b", "deferred", state(asynq.TaskStateRetry))
	if info.Retried != 0 || !strings.HasPrefix(info.LastErr, "provider gw paused: 401 Unauthorized") {
		t.Errorf("deferral: %+v", info)
	}
	b, _ := throttle.NewBucket("gw", 1000, 100)
	d, err := h.lim.Admit(context.Background(), throttle.Request{ID: "probe", Takes: []throttle.Take{{Rule: b, Subject: "gw"}}})
	if err != nil || d.Allowed() || d.Delay < 50*time.Second {
		t.Errorf("admission during the pause: %+v, %v", d, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// A digest to an address suppressed after its messages folded is archived
// without a send, as a message to it would be.
func TestDigestToASuppressedAddressIsNotSent(t *testing.T) {
	t.Parallel()
	f := newScopedFake(func(providers.Message) error { return nil })
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: 2 * time.Second})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, provider: f, screen: true, digests: true,
		book: true, inlineWait: time.Second, settings: PolicySettings{Digest: true}})
	h.enqueue(t, "m0", message.Notification{Recipient: "soon-dead"})
	h.await(t, "m0", "completed", state(asynq.TaskStateCompleted))
	h.enqueue(t, "m1", message.Notification{Recipient: "soon-dead"})
	h.await(t, "m1", "completed (folded)", state(asynq.TaskStateCompleted))
	scheduled, err := h.insp.ListScheduledTasks("default")
	if err != nil || len(scheduled) != 1 {
		t.Fatalf("scheduled: %d tasks, %v; want the digest", len(scheduled), err)
	}
	if err := screen.New(h.rdb, "").Suppress(context.Background(), "gw", "soon-dead", "410 Unregistered", time.Now()); err != nil {
		t.Fatal(err)
	}
	info := h.awaitFor(t, scheduled[0].ID, "archived", 15*time.Second, state(asynq.TaskStateArchived))
	if !strings.HasPrefix(info.LastErr, "suppressed by provider gw") {
		t.Errorf("the digest archived with %q, want its suppression", info.LastErr)
	}
	if n := f.callsTo("soon-dead"); n != 1 {
		t.Errorf("the suppressed address was sent to %d times, want once (before it was suppressed)", n)
	}
}
