//go:build integration

package integration_test

import (
	"slices"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// TestShardsChangedStrandNothing: notifications enqueued while redis.shards
// was 3 wait in the three shards of the queue; a worker started with 2
// serves its two shards and the old ones asynq still lists, so every
// notification is sent once.
func TestShardsChangedStrandNothing(t *testing.T) {
	cfg := recoveryConfig(10)
	cfg.Shards = 3
	f := newFleet(t, cfg, nil)
	notes := f.enqueueNotes("shards", 30, 1, 0, 0)
	var used []string
	for id := range notes {
		if q := asynqdb.ShardOf(fleetQueue, id, 3); !slices.Contains(used, q) {
			used = append(used, q)
		}
	}
	slices.Sort(used)
	queues, err := f.insp.Queues()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(queues)
	if len(used) != 3 || !slices.Equal(queues, used) {
		t.Fatalf("asynq lists queues %v; 30 notifications over 3 shards should use all of them (%v)", queues, used)
	}
	if gone := asynqdb.Shard(fleetQueue, 2, 3); slices.Contains(asynqdb.Names(asynqdb.Served(map[string]int{fleetQueue: 1}, 2, nil)), gone) {
		t.Fatalf("shard %s of 3 is also one of 2: the test shows nothing", gone)
	}
	f.cfg.Shards = 2
	f.startWorkers("w")
	f.waitAllEnded(60*time.Second, notes)
	checkOnce(t, f, notes)
}
