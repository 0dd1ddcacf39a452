//go:build integration

package campaign

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// TestFanoutOnCluster fans out on a 3-master Redis Cluster, in the 3
// shards of its queue, through a crash and a resume: every key a script
// touches is in one slot, and each shard gets its part.
func TestFanoutOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	rdb := cl.Client(t)
	cfg := testConfig(t, "127.0.0.1:1", testCampaign+"    queue: low\n", lines(1000))
	cfg.Redis.Shards = 3
	r := newRunner(t, cfg, rdb, Options{Batch: 100, Lease: testLease})
	ctx := context.Background()
	tick := recentTick("digest")
	crashAfter(t, r, tick, 3)
	expireLease(t, r, tick)
	other := twin(r)
	other.resumeAbandoned(ctx)
	other.wg.Wait()
	p, err := r.Progress(ctx, tick)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Summary{Tick: tick, Read: 1000, Enqueued: 1000, Done: true}); p != want {
		t.Errorf("progress:\n got %+v\nwant %+v", p, want)
	}
	total := 0
	for i := range 3 {
		n := len(pendingIDs(t, rdb, asynqdb.Shard("low", i, 3)))
		if n < 200 {
			t.Errorf("shard %d of low holds %d tasks, want about a third of 1000", i, n)
		}
		total += n
	}
	if total != 1000 {
		t.Errorf("%d tasks pending, want 1000", total)
	}
	id := tick.NotificationID("user42@example.com")
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(asynqdb.ShardOf("low", id, 3), id)
	if err != nil || info.State != asynq.TaskStatePending {
		t.Errorf("task: %+v %v", info, err)
	}
	// Firing a tick and catching up work on a cluster too.
	c := r.campaigns["digest"]
	if !r.fire(ctx, c, tick) {
		t.Error("fire failed")
	}
	r.catchUp(ctx, c, time.Now())
}
