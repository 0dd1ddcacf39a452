package campaign

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestLatest reports the last fired tick and its fan-out, and a zero tick
// for a campaign never fired.
func TestLatest(t *testing.T) {
	r, _ := testRunner(t, testCampaign, lines(40), Options{Batch: 16})
	ctx := context.Background()
	got, err := r.Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (Summary{}) {
		t.Fatalf("before any tick: %+v, want one zero summary", got)
	}
	// A worker starting records when the campaign was first scheduled:
	// that is not a tick.
	r.catchUp(ctx, r.campaigns["digest"], time.Now())
	if got, err = r.Latest(ctx); err != nil || got[0] != (Summary{}) {
		t.Fatalf("after the first schedule: %+v, %v; want a zero summary", got, err)
	}
	tick := NewTick("digest", time.Now().Add(2*time.Second)) // after the first schedule's record
	if !r.fire(ctx, r.campaigns["digest"], tick) {
		t.Fatal("fire failed")
	}
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	got, err = r.Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{Tick: tick, Read: 40, Enqueued: 40, Done: true}
	if len(got) != 1 || got[0] != want {
		t.Errorf("after the tick:\n got %+v\nwant %+v", got, want)
	}
}
