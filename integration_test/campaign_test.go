//go:build integration

package integration_test

// Campaigns end to end: worker processes on one redis-server, each
// running the campaign schedules, the log provider writing what they send to
// a file per worker. The helpers of this file start with "campaign"; from
// the shared harness it uses buildBinary and childEnv.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/throttle"
)

// TestCampaignThreeWorkersThreeTicks: three workers, a campaign of 300
// recipients firing at three ticks two seconds apart. Every worker fires
// every tick; exactly 900 notifications are sent, one per recipient and
// tick, none twice.
func TestCampaignThreeWorkersThreeTicks(t *testing.T) {
	t.Parallel() // no bound a busy core breaks: it runs beside the chaos runs
	const recipients = 300
	f := newCampaignFleet(t, campaignRecipients("r", recipients))
	ticks := campaignSlots(3, 2*time.Second)
	f.campaigns = fmt.Sprintf(`
  - name: trio
    cron: %q
    template: hello
    audience: {file: audience.txt}
`, campaignCron(ticks))
	ws := f.start("w1", "w2", "w3")

	want := map[string]bool{}
	for _, tk := range ticks {
		for _, r := range strings.Fields(campaignRecipients("r", recipients)) {
			want[campaign.NewTick("trio", tk).NotificationID(r)] = true
		}
	}
	f.waitFor("900 notifications sent", time.Until(ticks[2])+30*time.Second, func() bool {
		return len(f.sent()) >= len(want)
	})
	time.Sleep(time.Second) // time for a duplicate to show up, if there were one
	for _, w := range ws {
		f.stop(w)
	}

	sent := f.sent()
	if len(sent) != 900 {
		t.Errorf("%d notifications sent, want 900", len(sent))
	}
	for id, n := range sent {
		if !want[id] {
			t.Errorf("notification %s sent, not one of the campaign's", id)
		}
		if n != 1 {
			t.Errorf("notification %s sent %d times", id, n)
		}
	}
	// One worker's enqueue won each tick; every worker tried.
	if fired := f.logCount(ws, "campaign tick fired"); fired != 3 {
		t.Errorf("%d workers fired a tick first, want 3 (one per tick)", fired)
	}
	for _, tk := range ticks {
		p := f.progress(campaign.NewTick("trio", tk))
		if want := (campaign.Summary{Tick: p.Tick, Read: recipients, Enqueued: recipients, Done: true}); p != want {
			t.Errorf("tick %s: progress %+v, want %+v", tk.Format(time.TimeOnly), p, want)
		}
	}
	q := f.queue()
	if q.Pending+q.Active+q.Scheduled+q.Retry+q.Archived != 0 || q.Completed != 3 {
		t.Errorf("queue: %d pending, %d active, %d scheduled, %d retry, %d archived, %d completed (the 3 fan-outs, kept); want only those",
			q.Pending, q.Active, q.Scheduled, q.Retry, q.Archived, q.Completed)
	}
}

// TestCampaignKill9MidFanout kills the worker running a fan-out with
// SIGKILL in the middle of it. Another worker resumes the fan-out from its
// checkpoint once the dead one's lease expires, and every recipient has
// exactly one notification for the tick. The provider lets one message
// through and defers the rest for a long time, so that every notification
// stays in Redis to be counted.
func TestCampaignKill9MidFanout(t *testing.T) {
	t.Parallel() // no bound a busy core breaks: it runs beside the chaos runs
	const recipients = 20000
	f := newCampaignFleet(t, campaignRecipients("k", recipients))
	f.rate, f.burst = "0.001", 1
	tick := campaignSlots(1, 0)[0]
	f.campaigns = fmt.Sprintf(`
  - name: kill
    cron: %q
    template: hello
    audience: {file: audience.txt}
`, campaignCron([]time.Time{tick}))
	ws := f.start("w1", "w2", "w3")
	tk := campaign.NewTick("kill", tick)

	// Freeze Redis's writes once the fan-out is past its first batch, kill
	// its worker, and let Redis go on: the batch it was sending dies with
	// it. Progress is read while writes are paused (for a second at most),
	// so the fan-out cannot finish between the look and the kill.
	ctx := context.Background()
	var p campaign.Summary
	f.waitFor("the fan-out to start", time.Until(tick)+20*time.Second, func() bool {
		if err := f.rdb.Do(ctx, "CLIENT", "PAUSE", "1000", "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		if p = f.progress(tk); p.Read > 0 {
			return true
		}
		return f.rdb.Do(ctx, "CLIENT", "UNPAUSE").Err() != nil
	})
	if p.Done || p.Holder == "" {
		f.rdb.Do(ctx, "CLIENT", "UNPAUSE")
		t.Fatalf("the fan-out finished before it could be killed (%+v): make the audience larger", p)
	}
	victim := f.holder(ws, p.Holder)
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	if err := f.rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s at %d of %d recipients", victim.name, p.Read, recipients)

	f.waitFor("the fan-out to be resumed and finish", campaign.DefaultLease+30*time.Second, func() bool {
		return f.progress(tk).Done
	})
	p = f.progress(tk)
	if want := (campaign.Summary{Tick: tk, Read: recipients, Enqueued: recipients, Done: true}); p != want {
		t.Errorf("progress %+v, want %+v", p, want)
	}
	if f.logCount(ws, "campaign fan-out abandoned by its worker: resuming") == 0 {
		t.Errorf("no surviving worker says it resumed the fan-out")
	}

	// Every recipient's notification is in Redis, in one state, once, or
	// was sent; none is both or twice. A second for a duplicate to show up,
	// if there were one: an absence cannot be polled for.
	time.Sleep(time.Second)
	for _, w := range ws {
		if w != victim {
			f.stop(w)
		}
	}
	held := f.taskStates("default")
	sent := f.sent()
	for _, r := range strings.Fields(campaignRecipients("k", recipients)) {
		id := tk.NotificationID(r)
		if n := len(held[id]) + sent[id]; n != 1 {
			t.Errorf("recipient %s: notification held in %v and sent %d times, want once in all", r, held[id], sent[id])
		}
		delete(held, id)
	}
	delete(held, tk.TaskID())
	for id, states := range held {
		t.Errorf("task %s (%v) is none of the tick's", id, states)
	}
}

// TestCampaignRespectsCaps: recipients already at their weekly cap get a
// campaign's message deferred, or expired when the campaign has a send-by
// window, and never a message over the cap. The campaigns are triggered
// with campaign.Trigger, as enqueue does. The workers log in as the ACL
// user config.yaml recommends, and one audience is a Redis set.
func TestCampaignRespectsCaps(t *testing.T) {
	// As config.yaml's ACL user, one audience a Redis set (SSCAN).
	f := newCampaignFleetAs(t, "", true)
	f.files = map[string]string{"expiring.txt": campaignRecipients("e", 10)}
	if err := f.rdb.SAdd(context.Background(), "throttle:lists:deferred", strings.Fields(campaignRecipients("d", 10))).Err(); err != nil {
		t.Fatal(err)
	}
	f.campaigns = `
  - name: expiring
    cron: "0 0 1 1 *"
    template: news
    policy: weekly
    audience: {file: expiring.txt}
    send_by_window: 1h
  - name: deferred
    cron: "0 0 1 1 *"
    template: news
    policy: weekly
    audience: {redis_set: "throttle:lists:deferred"}
`
	// e0-e4 and d0-d4 have had their one message of the week.
	capped := map[string]bool{}
	lim, err := throttle.New(f.rdb, throttle.Options{Prefix: campaignPrefix})
	if err != nil {
		t.Fatal(err)
	}
	weekly, _ := throttle.NewQuota("weekly", throttle.Window{Limit: 1, Per: 168 * time.Hour})
	for _, r := range append(strings.Fields(campaignRecipients("e", 5)), strings.Fields(campaignRecipients("d", 5))...) {
		d, err := lim.Admit(context.Background(), throttle.Request{ID: "earlier-" + r, Takes: []throttle.Take{{Rule: weekly, Subject: r}}})
		if err != nil || !d.Allowed() {
			t.Fatalf("admitting %s: %+v %v", r, d, err)
		}
		capped[r] = true
	}
	ws := f.start("w1")

	cfg := f.config("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	now := time.Now()
	ticks := map[string]campaign.Tick{}
	for _, name := range []string{"expiring", "deferred"} {
		tk, err := campaign.Trigger(context.Background(), client, cfg, name, now)
		if err != nil {
			t.Fatalf("trigger %s: %v", name, err)
		}
		ticks[name] = tk
	}
	f.waitFor("10 sent, 5 expired, 5 deferred", 20*time.Second, func() bool {
		q := f.queue()
		return len(f.sent()) >= 10 && q.Archived >= 5 && q.Retry >= 5
	})
	time.Sleep(500 * time.Millisecond) // for a send to a capped recipient to show up, if there were one
	f.stop(ws[0])

	sent := f.sent()
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	for name, prefix := range map[string]string{"expiring": "e", "deferred": "d"} {
		tk := ticks[name]
		for _, r := range strings.Fields(campaignRecipients(prefix, 10)) {
			id := tk.NotificationID(r)
			if !capped[r] {
				if sent[id] != 1 {
					t.Errorf("%s: %s, under the cap, got %d messages, want 1", name, r, sent[id])
				}
				continue
			}
			if sent[id] != 0 {
				t.Errorf("%s: %s, at the cap, got a message", name, r)
			}
			info, err := insp.GetTaskInfo("default", id)
			if err != nil {
				t.Errorf("%s: %s: %v", name, r, err)
				continue
			}
			// Deferred to next week: booked there (the default), or, with
			// book: false, told when it may go.
			wantState, wantErr := asynq.TaskStateRetry, "by policy weekly"
			if name == "expiring" {
				wantState, wantErr = asynq.TaskStateArchived, "expired"
			}
			if info.State != wantState || !strings.Contains(info.LastErr, wantErr) {
				t.Errorf("%s: %s, at the cap: %s, %q; want %s, %q", name, r, info.State, info.LastErr, wantState, wantErr)
			}
		}
	}
	// The throttle's own record: never more than one message in a week, a
	// booking for next week included.
	for r := range capped {
		z := f.rdb.ZRangeWithScores(context.Background(), campaignPrefix+"{"+r+"}:q:weekly", 0, -1).Val()
		for i := 1; i < len(z); i++ {
			if gap := time.Duration(z[i].Score-z[i-1].Score) * time.Microsecond; gap < 168*time.Hour {
				t.Errorf("%s: two admissions %s apart, policy allows 1 per 168h", r, gap)
			}
		}
		if len(z) == 0 || len(z) > 2 {
			t.Errorf("%s: %d admissions, want its first and at most a booking a week on", r, len(z))
		}
	}
}

// ---------------------------------------------------------------------------
// Helpers

const campaignPrefix = "throttle:"

// campaignFleet is a redis-server and worker processes with a config each,
// differing only in the file their log provider writes to.
type campaignFleet struct {
	t         *testing.T
	dir       string
	redis     *redistest.Server
	rdb       *redis.Client
	files     map[string]string // audience files by name
	campaigns string            // the config's campaigns section
	rate      string            // of provider console
	burst     int
	runner    *campaign.Runner // reads progress; not run
	acl       bool             // the workers log in as config.yaml's ACL user
}

type campaignWorker struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// newCampaignFleet builds the worker first, so that the ticks the test
// then schedules a few seconds ahead are not past when the workers start.
func newCampaignFleet(t *testing.T, audience string) *campaignFleet {
	return newCampaignFleetAs(t, audience, false)
}

// newCampaignFleetAs is newCampaignFleet whose workers log in as
// config.yaml's ACL user when acl is set.
func newCampaignFleetAs(t *testing.T, audience string, acl bool) *campaignFleet {
	t.Helper()
	buildBinary(t, "worker")
	f := &campaignFleet{t: t, dir: t.TempDir(), rate: "20000", burst: 1000,
		files: map[string]string{"audience.txt": audience}, acl: acl}
	f.redis = startRedis(t, acl)
	f.rdb = f.redis.Client(t)
	return f
}

// configPath writes worker name's config (and the audience files) and
// returns its path.
func (f *campaignFleet) configPath(name string) string {
	f.t.Helper()
	for file, content := range f.files {
		if err := os.WriteFile(filepath.Join(f.dir, file), []byte(content), 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
	yaml := fmt.Sprintf(`redis: {url: %q, prefix: %q}
worker:
  concurrency: 20
  queues: {default: 1}
  shutdown_timeout: 3s
  http_addr: ""
  jitter: 0s
policies:
  generous: [{limit: 100, per: 1h}]
  weekly: [{limit: 1, per: 168h}]
providers:
  console: {type: log, output: %q, rate: %s, burst: %d}
defaults: {policy: generous, provider: console}
campaigns:%s`, redisURL(f.redis, f.acl), campaignPrefix, f.sentFile(name), f.rate, f.burst, f.campaigns)
	path := filepath.Join(f.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return path
}

func (f *campaignFleet) sentFile(name string) string {
	return filepath.Join(f.dir, "sent-"+name+".jsonl")
}

// config loads worker name's config, as enqueue would.
func (f *campaignFleet) config(name string) *config.Config {
	f.t.Helper()
	cfg, err := config.LoadWithEnv(filepath.Join(f.dir, name+".yaml"), func(string) string { return "" })
	if err != nil {
		f.t.Fatal(err)
	}
	return cfg
}

// start starts a worker per name and waits until each says it started.
func (f *campaignFleet) start(names ...string) []*campaignWorker {
	f.t.Helper()
	bin := buildBinary(f.t, "worker")
	var ws []*campaignWorker
	for _, name := range names {
		w := &campaignWorker{name: name, out: &syncBuffer{}, done: make(chan struct{})}
		w.cmd = exec.Command(bin, "-config", f.configPath(name))
		w.cmd.Env = childEnv()
		w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
		if err := w.cmd.Start(); err != nil {
			f.t.Fatal(err)
		}
		go func() {
			_ = w.cmd.Wait()
			close(w.done)
		}()
		f.t.Cleanup(func() {
			_ = w.cmd.Process.Kill()
			<-w.done
			if f.t.Failed() {
				f.t.Logf("worker %s:\n%s", w.name, tail(w.out.String(), 40))
			}
		})
		ws = append(ws, w)
	}
	for _, w := range ws {
		f.waitFor("worker "+w.name+" to start", 20*time.Second, func() bool {
			return strings.Contains(w.out.String(), "worker started")
		})
	}
	return ws
}

// stop stops w with SIGTERM and waits for it to exit.
func (f *campaignFleet) stop(w *campaignWorker) {
	f.t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(15 * time.Second):
		f.t.Fatalf("worker %s did not stop within 15s of SIGTERM", w.name)
	}
}

// holder returns the worker whose pid the lease token names.
func (f *campaignFleet) holder(ws []*campaignWorker, token string) *campaignWorker {
	f.t.Helper()
	parts := strings.Split(token, "/")
	if len(parts) == 3 {
		if pid, err := strconv.Atoi(parts[1]); err == nil {
			for _, w := range ws {
				if w.cmd.Process.Pid == pid {
					return w
				}
			}
		}
	}
	f.t.Fatalf("no worker holds lease %q", token)
	return nil
}

// sent returns the task IDs the workers' log providers wrote, and how often.
func (f *campaignFleet) sent() map[string]int {
	f.t.Helper()
	got := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(f.dir, "sent-*.jsonl"))
	for _, file := range files {
		fh, err := os.Open(file)
		if err != nil {
			f.t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var m struct{ ID string }
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				continue // a line being written
			}
			got[m.ID]++
		}
		fh.Close()
	}
	return got
}

// progress returns the recorded progress of tick's fan-out.
func (f *campaignFleet) progress(tick campaign.Tick) campaign.Summary {
	f.t.Helper()
	if f.runner == nil {
		r, err := campaign.New(f.config("w1"), f.rdb, campaign.Options{})
		if err != nil {
			f.t.Fatal(err)
		}
		f.runner = r
	}
	p, err := f.runner.Progress(context.Background(), tick)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// taskStates returns, by task ID, the asynq states queue holds it in: one
// each, unless a task was enqueued twice.
func (f *campaignFleet) taskStates(queue string) map[string][]string {
	f.t.Helper()
	ctx := context.Background()
	k := "asynq:{" + queue + "}:"
	got := map[string][]string{}
	for _, list := range []string{"pending", "active"} {
		for _, id := range f.rdb.LRange(ctx, k+list, 0, -1).Val() {
			got[id] = append(got[id], list)
		}
	}
	for _, zset := range []string{"scheduled", "retry", "archived", "completed"} {
		for _, id := range f.rdb.ZRange(ctx, k+zset, 0, -1).Val() {
			got[id] = append(got[id], zset)
		}
	}
	return got
}

func (f *campaignFleet) queue() asynq.QueueInfo {
	f.t.Helper()
	q, err := asynq.NewInspectorFromRedisClient(f.rdb).GetQueueInfo("default")
	if err != nil {
		f.t.Fatal(err)
	}
	return *q
}

// logCount counts the workers' log lines with msg.
func (f *campaignFleet) logCount(ws []*campaignWorker, msg string) int {
	n := 0
	for _, w := range ws {
		n += strings.Count(w.out.String(), `msg="`+msg+`"`)
	}
	return n
}

func (f *campaignFleet) waitFor(what string, timeout time.Duration, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %s waiting for %s", timeout.Round(time.Second), what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// campaignRecipients returns n recipients, one per line: <p>0@example.com ...
func campaignRecipients(p string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d@example.com\n", p, i)
	}
	return b.String()
}

// campaignSlots returns n whole-second moments, gap apart, the first a few
// seconds from now (time for the workers to start), all in one minute so
// that one cron spec names exactly them.
func campaignSlots(n int, gap time.Duration) []time.Time {
	first := time.Now().UTC().Truncate(time.Second).Add(5 * time.Second)
	last := first.Add(time.Duration(n-1) * gap)
	if last.Minute() != first.Minute() || last.Hour() != first.Hour() {
		first = last.Truncate(time.Minute)
	}
	var out []time.Time
	for i := range n {
		out = append(out, first.Add(time.Duration(i)*gap))
	}
	return out
}

// campaignCron returns the spec (with seconds, UTC) that fires at exactly
// the given moments of one minute.
func campaignCron(at []time.Time) string {
	var secs []string
	for _, t := range at {
		secs = append(secs, strconv.Itoa(t.Second()))
	}
	slices.Sort(secs)
	t := at[0]
	return fmt.Sprintf("%s %d %d %d %d *", strings.Join(secs, ","), t.Minute(), t.Hour(), t.Day(), int(t.Month()))
}
