package campaign

import (
	"context"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/lifecycle"
)

// TestFanoutRecordsAccepted: every notification a fan-out enqueues has its
// accepted event, naming the campaign's run and with the campaign's
// tenant; a recipient repeated in the audience has it once.
func TestFanoutRecordsAccepted(t *testing.T) {
	r, rdb := testRunner(t, testCampaign, lines(100)+"user3@example.com\n", Options{Batch: 16})
	ctx := context.Background()
	tick := recentTick("digest")
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	rec := lifecycle.NewRecorder(rdb, lifecycle.Options{})
	for _, rcpt := range []string{"user0@example.com", "user3@example.com", "user99@example.com"} {
		id := tick.NotificationID(rcpt)
		got, err := rec.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Type != lifecycle.Accepted || got[0].Via != lifecycle.ViaCampaign ||
			got[0].Campaign != tick.String() || got[0].Tenant != "digest" || got[0].Message != id {
			t.Errorf("history of %s: %+v, want one accepted event of the campaign's run", rcpt, got)
		}
		if n := rdb.LLen(ctx, "throttle:events:{"+id+"}").Val(); n != 1 {
			t.Errorf("%s's history holds %d events, want 1", rcpt, n)
		}
	}
}
