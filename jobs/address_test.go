package jobs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// numbers is a provider that takes only recipients starting with "+", and
// records what it was sent.
type numbers struct {
	mu   sync.Mutex
	sent []string
}

func (p *numbers) Send(_ context.Context, m providers.Message) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, m.Recipient)
	return "", nil
}

func (p *numbers) CheckRecipient(r string) error {
	if !strings.HasPrefix(r, "+") {
		return errors.New("not an E.164 number (+ and 8 to 15 digits)")
	}
	return nil
}

// TestAddresserRefusesBeforeSending: a job whose provider (an Addresser)
// refuses its recipient is archived as malformed with the reason, before
// any admission or send; a good one goes.
func TestAddresserRefusesBeforeSending(t *testing.T) {
	t.Parallel()
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 10, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 1000, 100)
	p := &numbers{}
	h := newHarnessWith(t, harnessConfig{quota: q, bucket: b, provider: p})
	h.enqueue(t, "bad", message.Notification{Recipient: "5550100008"})
	h.enqueue(t, "good", message.Notification{Recipient: "+14155550100"})
	info := h.await(t, "bad", "archived", state(asynq.TaskStateArchived))
	if want := "malformed notification: recipient: not an E.164 number (+ and 8 to 15 digits)"; !strings.HasPrefix(info.LastErr, want) {
		t.Errorf("archived with %q, want %q", info.LastErr, want)
	}
	h.await(t, "good", "completed", state(asynq.TaskStateCompleted))
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sent) != 1 || p.sent[0] != "+14155550100" {
		t.Errorf("sent to %q, want only +14155550100", p.sent)
	}
	if n := quotaSize(t, h, "5550100008"); n != 0 {
		t.Errorf("the refused job took %d of its recipient's quota", n)
	}
}
