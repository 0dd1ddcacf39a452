package main

import (
	"context"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
)

// TestAcceptedEvents: each notification enqueue enqueues has its accepted
// event, with its idempotency key as given, and a tenant with a callback
// gets it in its stream; one already there (a duplicate) gets none more.
func TestAcceptedEvents(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for range 2 { // the second is a duplicate
		if out := h.runArgs("-to", "+15551234567", "-template", "otp", "-key", "otp-42", "-tenant", "billing"); out.code != 0 {
			t.Fatalf("enqueue = %d, stderr %q", out.code, out.stderr)
		}
	}
	file := h.run(invocation{args: []string{"-config", testConfig, "-file", "-"},
		stdin: strings.NewReader(`{"recipient":"bob@example.com","template":"welcome"}` + "\n")})
	if file.code != 0 {
		t.Fatalf("enqueue -file = %d, stderr %q", file.code, file.stderr)
	}
	rec := lifecycle.NewRecorder(h.rdb, lifecycle.Options{})
	keyed, err := rec.History(ctx, message.TaskID("otp-42"))
	if err != nil {
		t.Fatal(err)
	}
	if len(keyed) != 1 || keyed[0].Type != lifecycle.Accepted || keyed[0].Via != lifecycle.ViaEnqueue ||
		keyed[0].IdempotencyKey != "otp-42" || keyed[0].Tenant != "billing" {
		t.Errorf("history of otp-42: %+v, want its accepted event, with its key", keyed)
	}
	if n := h.rdb.XLen(ctx, "throttle:callbacks:{billing}").Val(); n != 1 {
		t.Errorf("billing's callback stream holds %d events, want the one accepted", n)
	}
	var fromFile string
	for id := range h.pendingTasks("default") {
		if id != message.TaskID("otp-42") {
			fromFile = id
		}
	}
	if got, _ := rec.History(ctx, fromFile); len(got) != 1 || got[0].Type != lifecycle.Accepted || got[0].IdempotencyKey != "" || got[0].Tenant != "" {
		t.Errorf("history of the file's notification %s: %+v, want its accepted event", fromFile, got)
	}
}
