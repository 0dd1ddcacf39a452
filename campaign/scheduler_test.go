package campaign

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCatchUp runs a worker's start-up catch-up of an "@every 10s" campaign
// after outages of various lengths.
func TestCatchUp(t *testing.T) {
	now := time.Unix(1_717_405_205, 0) // 09:00:05 UTC: the last tick was 09:00:00
	tests := []struct {
		name    string
		catchUp string
		fired   int64 // the last tick fired before the outage; 0 for none
		want    int64 // the tick caught up; 0 for none
		record  int64 // the last tick fired after
	}{
		{"first start", "", 0, 0, now.Unix()},
		{"nothing missed", "", 1_717_405_200, 0, 1_717_405_200},
		{"one missed", "", 1_717_405_190, 1_717_405_200, 1_717_405_200},
		{"many missed, the latest within catch_up", "1m", 1_717_400_000, 1_717_405_200, 1_717_405_200},
		{"missed longer ago than catch_up", "4s", 1_717_405_190, 0, 1_717_405_200},
		{"catch_up off", "0s", 1_717_405_190, 0, 1_717_405_200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := strings.Replace(testCampaign, `"@every 1h"`, `"@every 10s"`, 1)
			if tt.catchUp != "" {
				spec += "    catch_up: " + tt.catchUp + "\n"
			}
			r, rdb := testRunner(t, spec, lines(1), Options{})
			ctx := context.Background()
			if tt.fired != 0 {
				rdb.ZAdd(ctx, firedKey(r.prefix), redis.Z{Score: float64(tt.fired), Member: "digest"})
			}
			r.catchUp(ctx, r.campaigns["digest"], now)
			var want []string
			if tt.want != 0 {
				want = []string{"campaign:digest:" + strconv.FormatInt(tt.want, 10)}
			}
			if got := fanoutIDs(t, rdb); !slices.Equal(got, want) {
				t.Errorf("fan-outs enqueued: %v, want %v", got, want)
			}
			if got := int64(rdb.ZScore(ctx, firedKey(r.prefix), "digest").Val()); got != tt.record {
				t.Errorf("last tick recorded: %d, want %d", got, tt.record)
			}
		})
	}
}

// TestRunFiresEachTickOnce runs three Runners of an "@every 1s" campaign,
// as three workers would, and checks that each tick has one fan-out task:
// no tick missing, none twice.
func TestRunFiresEachTickOnce(t *testing.T) {
	spec := strings.Replace(testCampaign, `"@every 1h"`, `"*/1 * * * * *"`, 1)
	r, rdb := testRunner(t, spec, lines(1), Options{})
	runners := []*Runner{r, twin(r), twin(r)}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		running time.Time // when the last runner started
	)
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			running = time.Now()
			mu.Unlock()
			r.Run(ctx)
		}()
	}
	// Three ticks are the least that show one per second; they take about
	// three seconds, longer on a busy machine.
	for deadline := time.Now().Add(30 * time.Second); len(fanoutIDs(t, rdb)) < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ticks fired in 30s: %v, want 3", fanoutIDs(t, rdb))
		}
	}
	cancel()
	wg.Wait()
	end := time.Now()

	ids := fanoutIDs(t, rdb)
	var ticks []int64
	for _, id := range ids {
		u, err := strconv.ParseInt(strings.TrimPrefix(id, "campaign:digest:"), 10, 64)
		if err != nil {
			t.Fatalf("fan-out task ID %q", id)
		}
		ticks = append(ticks, u)
	}
	slices.Sort(ticks)
	// Every second strictly after start and up to end, once. A tick
	// within a few ms of either edge may or may not have fired.
	first, last := start.Unix()+1, end.Unix()
	for i, u := range ticks {
		if i > 0 && u != ticks[i-1]+1 {
			t.Errorf("ticks fired: %v: not each second once", ticks)
			break
		}
	}
	mu.Lock()
	firstDue := running.Unix() + 1 // the first tick after every runner started
	mu.Unlock()
	if ticks[0] < first || ticks[0] > firstDue+1 || ticks[len(ticks)-1] > last {
		t.Errorf("ticks fired: %v, want from %d (%d at the latest) to %d", ticks, first, firstDue, last)
	}
	if got := int64(rdb.ZScore(context.Background(), firedKey(r.prefix), "digest").Val()); got != ticks[len(ticks)-1] {
		t.Errorf("last tick recorded: %d, want %d", got, ticks[len(ticks)-1])
	}
}

// fanoutIDs returns the IDs of the fan-out tasks pending, sorted, failing
// the test on an ID there twice.
func fanoutIDs(t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	var ids []string
	for id := range pendingIDs(t, rdb, "default") {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
