package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// TestOverCapDrop checks that a policy that drops archives a message its
// windows hold back at once, with the reason, counts it, and holds nothing
// for it; and that a message the provider holds back is deferred as usual.
func TestOverCapDrop(t *testing.T) {
	t.Parallel()
	for _, book := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "booking"}[book], func(t *testing.T) {
			t.Parallel()
			q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 0.01, 1) // one token, then one per 100s
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, book: book, settings: PolicySettings{Drop: true}})
			h.enqueue(t, "first", message.Notification{Recipient: "alice"})
			h.await(t, "first", "completed", state(asynq.TaskStateCompleted))
			h.enqueue(t, "second", message.Notification{Recipient: "alice"})
			info := h.await(t, "second", "archived", state(asynq.TaskStateArchived))
			if want := "dropped: over policy mkt (1 per 1h): skip retry for the task"; info.LastErr != want {
				t.Errorf("reason %q, want %q", info.LastErr, want)
			}
			if n := quotaSize(t, h, "alice"); n != 1 {
				t.Errorf("alice's quota holds %d entries after a drop, want 1 (the sent one)", n)
			}
			if n := counterValue(t, h.th.Metrics.Dropped, "mkt"); n != 1 {
				t.Errorf("dropped_total{policy=mkt} = %v, want 1", n)
			}
			// Bob is under his cap; the provider's bucket is empty: deferred.
			h.enqueue(t, "bob", message.Notification{Recipient: "bob"})
			info = h.await(t, "bob", "deferred", state(asynq.TaskStateRetry))
			if h.wasSent("bob") || !regexp.MustCompile(`provider gw`).MatchString(info.LastErr) {
				t.Errorf("bob: sent %v, reason %q: want deferred by the provider", h.wasSent("bob"), info.LastErr)
			}
		})
	}
}

// TestOverCapMaxDelay checks that a message whose moment is more than its
// policy's max delay after it was queued expires, saying so, and that one
// within it waits and goes.
func TestOverCapMaxDelay(t *testing.T) {
	t.Parallel()
	for _, book := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "booking"}[book], func(t *testing.T) {
			t.Parallel()
			q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: 2 * time.Second}, throttle.Window{Limit: 2, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 1000, 100)
			h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, book: book, inlineWait: 2500 * time.Millisecond,
				settings: PolicySettings{MaxDelay: 10 * time.Minute}})
			h.enqueue(t, "first", message.Notification{Recipient: "alice"})
			h.await(t, "first", "completed", state(asynq.TaskStateCompleted))
			h.enqueue(t, "second", message.Notification{Recipient: "alice"}) // 2s later: within 10m
			h.await(t, "second", "completed", state(asynq.TaskStateCompleted))
			h.enqueue(t, "third", message.Notification{Recipient: "alice"}) // an hour later: past 10m
			info := h.await(t, "third", "archived", state(asynq.TaskStateArchived))
			re := `^expired: max_delay 10m of policy mkt \(until [0-9T:-]+Z\) passed before policy mkt \(2 per 1h\) would allow it \(earliest [0-9T:-]+Z\)`
			if !regexp.MustCompile(re).MatchString(info.LastErr) {
				t.Errorf("reason %q, want it to match %s", info.LastErr, re)
			}
			if h.wasSent("third") || quotaSize(t, h, "alice") != 2 {
				t.Errorf("third sent %v, alice's quota %d entries: want not sent, 2", h.wasSent("third"), quotaSize(t, h, "alice"))
			}
			if n := counterValue(t, h.th.Metrics.Expired, "mkt"); n != 1 {
				t.Errorf("expired_total{policy=mkt} = %v, want 1", n)
			}
		})
	}
}

// TestCountsToward checks count-only traffic through the handler: a
// reset that counts toward marketing goes though marketing is full, makes
// marketing wait when it goes first, and gives its count back when the
// provider refuses it.
func TestCountsToward(t *testing.T) {
	t.Parallel()
	for _, book := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "booking"}[book], func(t *testing.T) {
			t.Parallel()
			mkt, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
			reset, _ := throttle.NewQuota("reset", throttle.Window{Limit: 5, Per: time.Hour})
			b, _ := throttle.NewBucket("gw", 1000, 100)
			h := newHarnessWith(t, harnessConfig{quota: mkt, bucket: b, book: book,
				moreQuotas: map[string]*throttle.Quota{"reset": reset},
				more:       map[string]PolicySettings{"reset": {CountsToward: []*throttle.Quota{mkt}}}})
			resetOf := func(to string) message.Notification {
				return message.Notification{Recipient: to, Policy: "reset", Provider: "gw", Template: "reset"}
			}
			h.fail = func(m providers.Message) error {
				if m.Recipient == "carol" && m.Template == "reset" {
					return &providers.SendError{Outcome: providers.Reject, Err: errors.New("400 no such number")}
				}
				return nil
			}
			// Alice: marketing first, then two resets go all the same.
			h.enqueue(t, "alice-promo", message.Notification{Recipient: "alice"})
			h.await(t, "alice-promo", "completed", state(asynq.TaskStateCompleted))
			h.enqueue(t, "alice-reset-1", resetOf("alice"))
			h.enqueue(t, "alice-reset-2", resetOf("alice"))
			h.await(t, "alice-reset-1", "completed", state(asynq.TaskStateCompleted))
			h.await(t, "alice-reset-2", "completed", state(asynq.TaskStateCompleted))
			// Bob: a reset first, and marketing backs off.
			h.enqueue(t, "bob-reset", resetOf("bob"))
			h.await(t, "bob-reset", "completed", state(asynq.TaskStateCompleted))
			h.enqueue(t, "bob-promo", message.Notification{Recipient: "bob"})
			info := h.await(t, "bob-promo", "deferred", state(asynq.TaskStateRetry))
			if h.wasSent("bob-promo") || !strings.Contains(info.LastErr, "policy mkt (1 per 1h)") {
				t.Errorf("bob's promo after a reset: sent %v, %q; want held back by mkt", h.wasSent("bob-promo"), info.LastErr)
			}
			// Carol: the provider refuses the reset; marketing is not held.
			h.enqueue(t, "carol-reset", resetOf("carol"))
			h.await(t, "carol-reset", "archived", state(asynq.TaskStateArchived))
			h.enqueue(t, "carol-promo", message.Notification{Recipient: "carol"})
			h.await(t, "carol-promo", "completed", state(asynq.TaskStateCompleted))
		})
	}
}

// TestShadow checks shadow mode: every message goes as if the rule in it
// were absent, a policy's windows still count them, and what the rule
// would have done is counted by rule.
func TestShadow(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	slow, _ := throttle.NewBucket("gw", 0.01, 1) // one token, then one per 100s
	fast, _ := throttle.NewBucket("gw", 1000, 100)
	tests := []struct {
		name     string
		c        harnessConfig
		to       []string // a message to each, in turn
		atOnce   bool     // enqueued all at once, not each awaited
		rule     string
		deferred float64
		dropped  float64
		counted  int64 // entries in alice's quota at the end
	}{
		{"policy", harnessConfig{quota: q, bucket: fast, settings: PolicySettings{Shadow: true}},
			[]string{"alice", "alice", "alice"}, false, "policy mkt (1 per 1h)", 2, 0, 3},
		{"policy that drops, booking", harnessConfig{quota: q, bucket: fast, book: true, settings: PolicySettings{Shadow: true, Drop: true}},
			[]string{"alice", "alice"}, false, "policy mkt (1 per 1h)", 0, 1, 2},
		{"provider", harnessConfig{quota: q, bucket: slow, shadowBucket: true},
			[]string{"alice", "bob", "carol"}, false, "provider gw (0.01/s burst 1)", 2, 0, 1},
		// Racing on one recipient, each sees the ones before it: the
		// would-be decision is taken in the step that counts it.
		{"policy, all at once", harnessConfig{quota: q, bucket: fast, settings: PolicySettings{Shadow: true}},
			[]string{"alice", "alice", "alice", "alice", "alice"}, true, "policy mkt (1 per 1h)", 4, 0, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, tc.c)
			var ids []string
			for i, to := range tc.to {
				id := fmt.Sprintf("%s-%d", to, i)
				h.enqueue(t, id, message.Notification{Recipient: to})
				if ids = append(ids, id); !tc.atOnce {
					h.await(t, id, "completed", state(asynq.TaskStateCompleted))
				}
			}
			for _, id := range ids {
				h.await(t, id, "completed", state(asynq.TaskStateCompleted))
			}
			if got := counterValue(t, h.th.Metrics.Shadow, tc.rule, "deferred"); got != tc.deferred {
				t.Errorf("shadow_total{rule=%q, would=deferred} = %v, want %v", tc.rule, got, tc.deferred)
			}
			if got := counterValue(t, h.th.Metrics.Shadow, tc.rule, "dropped"); got != tc.dropped {
				t.Errorf("shadow_total{rule=%q, would=dropped} = %v, want %v", tc.rule, got, tc.dropped)
			}
			if n := quotaSize(t, h, "alice"); n != tc.counted {
				t.Errorf("alice's quota holds %d entries, want %d", n, tc.counted)
			}
		})
	}
}

// TestSwap checks that rules swapped in while the worker runs apply to the
// next job, to the history already in Redis, and that a job whose policy
// is gone is archived with the reason.
func TestSwap(t *testing.T) {
	t.Parallel()
	loose, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 5, Per: time.Hour})
	tight, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 2, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: loose, bucket: b})
	for _, id := range []string{"a1", "a2"} {
		h.enqueue(t, id, message.Notification{Recipient: "alice"})
		h.await(t, id, "completed", state(asynq.TaskStateCompleted))
	}
	providers := h.th.rules().Providers
	h.th.Swap(Rules{Policies: map[string]*throttle.Quota{"mkt": tight}, Providers: providers})
	h.enqueue(t, "a3", message.Notification{Recipient: "alice"})
	info := h.await(t, "a3", "deferred", state(asynq.TaskStateRetry))
	if !strings.HasPrefix(info.LastErr, "throttled by policy mkt (2 per 1h)") {
		t.Errorf("a3 after the swap: %q, want throttled by the new limit", info.LastErr)
	}
	h.th.Swap(Rules{Policies: map[string]*throttle.Quota{}, Providers: providers})
	h.enqueue(t, "b1", message.Notification{Recipient: "bob"})
	info = h.await(t, "b1", "archived", state(asynq.TaskStateArchived))
	if want := `malformed notification: policy "mkt" is not defined`; !strings.HasPrefix(info.LastErr, want) {
		t.Errorf("b1 with its policy gone: %q, want %q", info.LastErr, want)
	}
}

// TestDigest checks over_cap: digest through the handler: of four
// messages to one recipient under 1 per 10s, the first goes alone and the
// three over the cap are folded, in order, into one digest sent at the
// recipient's next allowed moment; none of them goes on its own. (The four
// go one after another, each awaited, within the window: 10s leaves room
// for a loaded machine.)
func TestDigest(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: 10 * time.Second})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	var mu sync.Mutex
	var got []providers.Message
	prov := providers.Func(func(_ context.Context, m providers.Message) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, m)
		return "", nil
	})
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, book: true, digests: true, provider: prov,
		inlineWait: time.Second, settings: PolicySettings{Digest: true}})
	for i := range 4 {
		id := fmt.Sprintf("m%d", i)
		h.enqueue(t, id, message.Notification{Recipient: "alice", Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		h.await(t, id, "completed", state(asynq.TaskStateCompleted))
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the provider got %d messages, want the first and a digest", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].ID != "m0" || got[1].Template != digest.Template {
		t.Fatalf("the provider got %+v, want m0 then one digest", got)
	}
	var sent struct {
		Policy   string
		Messages []providers.Message
	}
	if err := json.Unmarshal(got[1].Data, &sent); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range sent.Messages {
		ids = append(ids, e.ID+":"+string(e.Data))
	}
	if want := []string{`m1:{"n":1}`, `m2:{"n":2}`, `m3:{"n":3}`}; sent.Policy != "mkt" || !slices.Equal(ids, want) {
		t.Errorf("digest of %s carries %v, want %v", sent.Policy, ids, want)
	}
	if n := counterValue(t, h.th.Metrics.Folded, "mkt"); n != 3 {
		t.Errorf("folded_total{policy=mkt} = %v, want 3", n)
	}
	if err := h.rdb.ZScore(context.Background(), "throttle:{alice}:q:mkt", got[1].ID).Err(); err != nil {
		t.Errorf("the digest holds no entry in alice's quota: %v", err)
	}
}

// TestDigestFoldsTakenAtOnceAgree checks that messages folded at the same
// time, by several of a worker's goroutines, all put their digest at the
// first moment the policy allows after the message that was sent: none
// books a moment of its own that the next fold would find taken (which put
// the digest a window, or several, later).
func TestDigestFoldsTakenAtOnceAgree(t *testing.T) {
	t.Parallel()
	const per = 10 * time.Second
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: per})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, book: true, digests: true,
		inlineWait: time.Second, settings: PolicySettings{Digest: true}})
	h.enqueue(t, "m0", message.Notification{Recipient: "alice"})
	h.await(t, "m0", "completed", state(asynq.TaskStateCompleted))
	first, _ := h.sentAt("m0")
	var ids []string
	for i := 1; i <= 8; i++ {
		ids = append(ids, fmt.Sprintf("m%d", i))
		h.enqueue(t, ids[i-1], message.Notification{Recipient: "alice"})
	}
	for _, id := range ids {
		h.await(t, id, "completed", state(asynq.TaskStateCompleted))
	}
	if n := counterValue(t, h.th.Metrics.Folded, "mkt"); n != 8 {
		t.Fatalf("folded_total{policy=mkt} = %v, want 8", n)
	}
	digests, err := h.insp.ListScheduledTasks("default")
	if err != nil {
		t.Fatal(err)
	}
	if len(digests) != 1 {
		t.Fatalf("%d scheduled tasks, want the one digest: %+v", len(digests), digests)
	}
	// asynq keeps whole seconds: the digest may run up to a second after
	// the moment asked for.
	if at, latest := digests[0].NextProcessAt, first.Add(per+time.Second); at.After(latest) {
		t.Errorf("the digest runs at %s, %s after the sent message; want within %s",
			at.Format("15:04:05.000"), at.Sub(first).Round(time.Millisecond), per+time.Second)
	}
}
