package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/internal/clip"
	"github.com/notify-throttle/throttler/message"
	"github.com/redis/go-redis/v9"
)

// TestFanoutCounts fans out a file with duplicates and every kind of bad
// line, and checks the counts and the tasks.
func TestFanoutCounts(t *testing.T) {
	audience := lines(1000) +
		"user3@example.com\n" + // a duplicate
		"\n   \n" + // two blank lines
		strings.Repeat("x", 300) + "\n" + // longer than MaxRecipientLen
		strings.Repeat("y", 100_000) + "\n" + // longer than the line buffer
		"bad\xffutf8\n" +
		"  crlf@example.com \r\n" +
		"last@example.com" // no newline at the end
	r, rdb := testRunner(t, testCampaign+"    send_by_window: 2h\n", audience, Options{Batch: 64})
	ctx := context.Background()
	tick := recentTick("digest")
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	got, err := r.Progress(ctx, tick)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{Tick: tick, Read: 1008, Enqueued: 1002, Existing: 1, Invalid: 5, Done: true}
	if got != want {
		t.Errorf("progress:\n got %+v\nwant %+v", got, want)
	}
	pending := pendingIDs(t, rdb, "default")
	if len(pending) != 1002 {
		t.Errorf("%d tasks pending, want 1002", len(pending))
	}
	for _, rcpt := range []string{"user0@example.com", "user999@example.com", "crlf@example.com", "last@example.com"} {
		if !pending[tick.NotificationID(rcpt)] {
			t.Errorf("no task for %s", rcpt)
		}
	}

	// What asynq reads back is the notification, with its send-by.
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo("default", tick.NotificationID("user7@example.com"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := message.Decode(info.Payload)
	if err != nil {
		t.Fatal(err)
	}
	sendBy := tick.Time().Add(2 * time.Hour)
	if info.Type != message.TaskType || info.MaxRetry != message.DefaultMaxRetry || info.State != asynq.TaskStatePending ||
		n.Recipient != "user7@example.com" || n.Policy != "weekly" || n.Provider != "console" || n.Template != "digest" ||
		string(n.Data) != `{"title":"Your week"}` || n.SendBy == nil || !n.SendBy.Equal(sendBy) || n.Campaign != tick.String() {
		t.Errorf("task %+v\nnotification %+v", info, n)
	}

	// The tick is done: running it again enqueues nothing.
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	if again, _ := r.Progress(ctx, tick); again != want {
		t.Errorf("progress after a second run: %+v", again)
	}
	if n := len(pendingIDs(t, rdb, "default")); n != 1002 {
		t.Errorf("%d tasks pending after a second run, want 1002", n)
	}
	// Nothing is left of the run but its progress.
	for _, k := range []string{keysOf(r.prefix, "default", tick).lease, seenKey(r.prefix, "default", tick)} {
		if n := rdb.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("%s still exists", k)
		}
	}
	if n := rdb.ZCard(ctx, runningKey(r.prefix, "default")).Val(); n != 0 {
		t.Errorf("%d fan-outs still in the running set", n)
	}
}

// TestFanoutMatchesAsynqClient fans out on one server and enqueues the same
// notifications with asynq's Client on another: asynq's keys must be the
// same, byte for byte, but for the enqueue times (pending_since, and
// queued_at, which the two stamp a moment apart: a second may turn between).
// The notifications carry the campaign's tenant, by default its name.
func TestFanoutMatchesAsynqClient(t *testing.T) {
	audience := lines(300)
	r, ours := testRunner(t, testCampaign+"    queue: low\n    send_by_window: 1h\n", audience, Options{Batch: 100})
	theirs, _ := testRunner(t, testCampaign, "", Options{})
	ctx := context.Background()
	tick := recentTick("digest")
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClientFromRedisClient(theirs.rdb)
	sendBy := tick.Time().Add(time.Hour)
	for _, rcpt := range strings.Fields(audience) {
		n := message.Notification{Recipient: rcpt, Policy: "weekly", Provider: "console", Template: "digest",
			Data: json.RawMessage(`{"title":"Your week"}`), SendBy: &sendBy, Campaign: tick.String(), Tenant: "digest"}
		task, err := message.NewTask(n, tick.NotificationID(rcpt), asynq.Queue("low"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task); err != nil {
			t.Fatal(err)
		}
	}
	want, got := asynqState(t, theirs.rdb), asynqState(t, ours)
	if len(want) != 300+2 {
		t.Fatalf("asynq's client wrote %d keys, want 302", len(want))
	}
	for k, w := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s: missing", k)
		} else if g != w {
			t.Errorf("%s:\n got %q\nwant %q", k, clip.Cut(g, 300, "..."), clip.Cut(w, 300, "..."))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: not written by asynq's client", k)
		}
	}
}

// TestFanoutResumesAfterCrash abandons a fan-out after three batches, as a
// worker killed with -9 would, and checks that another worker resumes it
// after the lease expires, from the checkpoint: not one recipient before it
// is enqueued again, even those whose tasks were delivered and deleted in
// between.
func TestFanoutResumesAfterCrash(t *testing.T) {
	r, rdb := testRunner(t, testCampaign, lines(1000), Options{Batch: 100, Lease: testLease})
	ctx := context.Background()
	tick := recentTick("digest")
	crashed := crashAfter(t, r, tick, 3)

	// While the lease holds, the fan-out task finds it busy.
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Progress(ctx, tick); p.Enqueued != 300 || p.Done {
		t.Fatalf("progress while the lease holds: %+v", p)
	}
	// The first 300 are delivered: their tasks are gone.
	for _, id := range crashed {
		rdb.Del(ctx, "asynq:{default}:t:"+id)
		rdb.LRem(ctx, "asynq:{default}:pending", 0, id)
	}
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
	pending := pendingIDs(t, rdb, "default")
	for _, id := range crashed {
		if pending[id] {
			t.Errorf("task %s enqueued again after the crash", id)
		}
	}
	if len(pending) != 700 {
		t.Errorf("%d tasks pending, want the 700 after the checkpoint", len(pending))
	}
}

// TestFanoutTakeover lets a run's lease expire while it is alive: another
// run resumes, and the first one, at its next batch, learns it lost the
// fan-out and stops, so the two never enqueue the same batch.
func TestFanoutTakeover(t *testing.T) {
	r, rdb := testRunner(t, testCampaign, lines(1000), Options{Batch: 100, Lease: testLease})
	ctx := context.Background()
	tick := recentTick("digest")
	c := r.campaigns["digest"]
	slow := claimRun(t, r, tick)
	src, err := openAudience(rdb, c.Audience, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	batch, pos, _, _ := src.next(ctx, 100)
	if _, err := slow.send(ctx, batch, pos, "0"); err != nil {
		t.Fatal(err)
	}
	expireLease(t, r, tick) // the slow run stalled past its lease
	if _, err := r.fanOut(ctx, c, tick, "resume"); err != nil {
		t.Fatal(err)
	}
	batch, pos, _, _ = src.next(ctx, 100)
	if _, err := slow.send(ctx, batch, pos, "0"); !errors.Is(err, errLeaseLost) {
		t.Errorf("slow run's next batch: %v, want errLeaseLost", err)
	}
	p, _ := r.Progress(ctx, tick)
	if want := (Summary{Tick: tick, Read: 1000, Enqueued: 1000, Done: true}); p != want {
		t.Errorf("progress:\n got %+v\nwant %+v", p, want)
	}
	if n := len(pendingIDs(t, rdb, "default")); n != 1000 {
		t.Errorf("%d tasks pending, want 1000", n)
	}
}

// TestFanoutRedisSet fans out a Redis set, abandoning the first run after
// one SSCAN batch.
func TestFanoutRedisSet(t *testing.T) {
	r, rdb := testRunner(t, `
  - name: digest
    cron: "@every 1h"
    template: digest
    audience: {redis_set: "digest:subscribers"}
`, "", Options{Batch: 100, Lease: testLease})
	ctx := context.Background()
	members := strings.Fields(lines(2000))
	members = append(members, strings.Repeat("z", 257))
	if err := rdb.SAdd(ctx, "digest:subscribers", members).Err(); err != nil {
		t.Fatal(err)
	}
	tick := recentTick("digest")
	crashAfter(t, r, tick, 1)
	expireLease(t, r, tick)
	r.resumeAbandoned(ctx)
	r.wg.Wait()
	p, _ := r.Progress(ctx, tick)
	if p.Enqueued != 2000 || p.Invalid != 1 || p.Read != 2001+p.Existing || !p.Done {
		t.Errorf("progress: %+v, want 2000 enqueued, 1 invalid", p)
	}
	pending := pendingIDs(t, rdb, "default")
	for _, m := range members[:2000] {
		if !pending[tick.NotificationID(m)] {
			t.Fatalf("no task for %s", m)
		}
	}
}

// TestFanoutExpired: a tick whose send-by has passed enqueues nothing.
func TestFanoutExpired(t *testing.T) {
	r, rdb := testRunner(t, testCampaign+"    send_by_window: 30s\n", lines(10), Options{})
	ctx := context.Background()
	tick := recentTick("digest") // a minute ago
	if err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, tick.payload())); err != nil {
		t.Fatal(err)
	}
	p, _ := r.Progress(ctx, tick)
	if want := (Summary{Tick: tick, Done: true, Expired: true}); p != want {
		t.Errorf("progress:\n got %+v\nwant %+v", p, want)
	}
	if n := rdb.LLen(ctx, "asynq:{default}:pending").Val(); n != 0 {
		t.Errorf("%d tasks pending, want none", n)
	}
}

// TestFanoutErrors: what cannot be fanned out is an error for asynq to
// retry or archive, never a panic.
func TestFanoutErrors(t *testing.T) {
	r, _ := testRunner(t, testCampaign, lines(10), Options{})
	ctx := context.Background()
	tests := []struct {
		name    string
		payload string
		skip    bool // archived at once
	}{
		{"not JSON", `{`, true},
		{"no campaign", `{"tick": 1700000000}`, true},
		{"unknown campaign", fmt.Sprintf(`{"campaign": "nope", "tick": %d}`, time.Now().Unix()), true},
		{"too old", `{"campaign": "digest", "tick": 1700000000}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, []byte(tt.payload)))
			if err == nil || errors.Is(err, asynq.SkipRetry) != tt.skip {
				t.Errorf("err = %v, want SkipRetry %v", err, tt.skip)
			}
		})
	}
	t.Run("audience file gone", func(t *testing.T) {
		if err := os.Remove(r.campaigns["digest"].Audience.File); err != nil {
			t.Fatal(err)
		}
		err := r.ProcessTask(ctx, asynq.NewTask(TypeFanout, recentTick("digest").payload()))
		if err == nil || errors.Is(err, asynq.SkipRetry) || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("err = %v, want a retried error wrapping os.ErrNotExist", err)
		}
	})
}

// crashAfter runs n batches of tick's fan-out and leaves it, lease held,
// like a worker killed -9, returning the IDs it enqueued.
func crashAfter(t *testing.T, r *Runner, tick Tick, n int) []string {
	t.Helper()
	ctx := context.Background()
	run := claimRun(t, r, tick)
	src, err := openAudience(r.rdb, r.campaigns[tick.Campaign].Audience, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var ids []string
	for range n {
		batch, pos, _, err := src.next(ctx, r.opts.Batch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.send(ctx, batch, pos, "0"); err != nil {
			t.Fatal(err)
		}
		for _, e := range batch {
			ids = append(ids, tick.NotificationID(e.recipient))
		}
	}
	return ids
}

// testLease is the lease of the tests' fan-outs: long enough that no run
// loses it on a slow machine; expireLease ends it where a test needs that.
const testLease = time.Minute

// expireLease ends tick's fan-out lease now, as its running out does when a
// worker stops renewing it, and waits until Redis has dropped it.
func expireLease(t *testing.T, r *Runner, tick Tick) {
	t.Helper()
	ctx := context.Background()
	key := keysOf(r.prefix, r.campaigns[tick.Campaign].Queue, tick).lease
	if err := r.rdb.PExpire(ctx, key, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, err := r.rdb.Exists(ctx, key).Result()
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s still there 10s after it was to expire: %v", key, err)
		}
	}
}

// claimRun claims tick's fan-out as a run that the test drives batch by batch.
func claimRun(t *testing.T, r *Runner, tick Tick) *batchRun {
	t.Helper()
	c := r.campaigns[tick.Campaign]
	k := keysOf(r.prefix, c.Queue, tick)
	token := newToken()
	res, err := claimScript.Run(context.Background(), r.rdb, []string{k.progress, k.lease, k.running},
		token, r.opts.Lease.Milliseconds(), runningMember(tick), tick.Unix, 3600, time.Now().Unix(), "start").StringSlice()
	if err != nil || res[0] != "ok" {
		t.Fatalf("claim: %v %v", res, err)
	}
	return &batchRun{r: r, c: c, tick: tick, keys: k, token: token}
}

// asynqState returns asynq's keys and their contents as strings, the
// enqueue times left out.
var queuedAt = regexp.MustCompile(`"queued_at":"[^"]*"`)

func asynqState(t *testing.T, rdb redis.UniversalClient) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "asynq:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		switch rdb.Type(ctx, k).Val() {
		case "hash":
			h := rdb.HGetAll(ctx, k).Val()
			delete(h, "pending_since")
			// queued_at is of one length (whole seconds, UTC): the
			// message's framing is the same whatever its value.
			if msg, ok := h["msg"]; ok {
				h["msg"] = queuedAt.ReplaceAllString(msg, `"queued_at":"-"`)
			}
			out[k] = fmt.Sprint(h)
		case "list":
			out[k] = strings.Join(rdb.LRange(ctx, k, 0, -1).Val(), ",")
		case "set":
			m := rdb.SMembers(ctx, k).Val()
			slices.Sort(m)
			out[k] = strings.Join(m, ",")
		default:
			out[k] = "type " + rdb.Type(ctx, k).Val()
		}
	}
	return out
}
