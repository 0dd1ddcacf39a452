package campaign

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestList(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1", `
  - name: digest
    cron: "0 9 * * MON"
    timezone: Europe/Paris
    template: digest
    audience: {file: audience.txt}
  - name: pulse
    cron: "@every 10m"
    template: pulse
    queue: low
    audience: {redis_set: pulse}
`, "")
	from := time.Date(2024, 6, 3, 8, 58, 0, 0, time.UTC) // a Monday
	got, err := List(cfg, from, 3)
	if err != nil {
		t.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	want := []Entry{
		{Name: "digest", Cron: "0 9 * * MON", Timezone: "Europe/Paris", Audience: "file " + cfg.Campaigns[0].Audience.File, Queue: "default",
			Next: []time.Time{time.Date(2024, 6, 10, 9, 0, 0, 0, paris), time.Date(2024, 6, 17, 9, 0, 0, 0, paris), time.Date(2024, 6, 24, 9, 0, 0, 0, paris)}},
		{Name: "pulse", Cron: "@every 10m", Audience: "redis set pulse", Queue: "low",
			Next: []time.Time{time.Date(2024, 6, 3, 9, 0, 0, 0, time.UTC), time.Date(2024, 6, 3, 9, 10, 0, 0, time.UTC), time.Date(2024, 6, 3, 9, 20, 0, 0, time.UTC)}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		same := g.Name == w.Name && g.Cron == w.Cron && g.Timezone == w.Timezone && g.Audience == w.Audience &&
			g.Queue == w.Queue && len(g.Next) == len(w.Next)
		for j := 0; same && j < len(w.Next); j++ {
			same = g.Next[j].Equal(w.Next[j]) && g.Next[j].Location().String() == w.Next[j].Location().String()
		}
		if !same {
			t.Errorf("entry %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

func TestTrigger(t *testing.T) {
	r, rdb := testRunner(t, testCampaign, lines(3), Options{})
	cfg := testConfig(t, "127.0.0.1:1", testCampaign, "")
	client := asynq.NewClientFromRedisClient(rdb)
	ctx := context.Background()
	now := time.Now()
	tick, err := Trigger(ctx, client, cfg, "digest", now)
	if err != nil {
		t.Fatal(err)
	}
	if tick != NewTick("digest", now) {
		t.Errorf("tick = %+v", tick)
	}
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo("default", tick.TaskID())
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != TypeFanout || string(info.Payload) != string(tick.payload()) {
		t.Errorf("task %+v", info)
	}
	// The worker fans the triggered tick out like a scheduled one.
	if err := r.ProcessTask(ctx, asynq.NewTask(info.Type, info.Payload)); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Progress(ctx, tick); p.Enqueued != 3 || !p.Done {
		t.Errorf("progress %+v", p)
	}
	if _, err := Trigger(ctx, client, cfg, "digest", now); !errors.Is(err, ErrAlreadyFired) {
		t.Errorf("second trigger in the same second: %v, want ErrAlreadyFired", err)
	}
	if _, err := Trigger(ctx, client, cfg, "nope", now); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown campaign: %v, want ErrUnknown", err)
	}
}
