package api

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// TestShards: with 3 shards a queue, each notification goes to the shard
// of its ID, and GET, the list and DELETE find it there, by ID and by key.
func TestShards(t *testing.T) {
	f := newFixture(t, func(c *config.Config) { c.Redis.Shards = 3 })
	shards := map[string]bool{}
	var ids []string
	for i := range 12 {
		r := f.post(billingKey, welcome, "Idempotency-Key", "shard-"+string(rune('a'+i)))
		if r.status != http.StatusAccepted {
			t.Fatalf("POST = %d %v", r.status, r.body)
		}
		id := r.body["id"].(string)
		if q := r.body["queue"]; q != asynqdb.ShardOf("default", id, 3) {
			t.Errorf("%s went to %v, want its shard %s", id, q, asynqdb.ShardOf("default", id, 3))
		}
		shards[r.body["queue"].(string)] = true
		ids = append(ids, id)
	}
	if len(shards) < 2 {
		t.Errorf("12 notifications used shards %v, want several", shards)
	}
	for _, path := range []string{ids[5], "shard-f"} {
		if got := f.do(http.MethodGet, "/v1/notifications/"+path, billingKey, ""); got.status != http.StatusOK || got.body["id"] != ids[5] {
			t.Errorf("GET %s = %d %v", path, got.status, got.body)
		}
	}
	if listed, _, _ := f.page(t, billingKey, url.Values{}); len(listed) != 12 {
		t.Errorf("the list holds %d, want 12", len(listed))
	}
	if del := f.do(http.MethodDelete, "/v1/notifications/"+ids[7], billingKey, ""); del.status != http.StatusOK || del.body["state"] != "canceled" {
		t.Errorf("DELETE = %d %v, want 200 canceled", del.status, del.body)
	}
}
