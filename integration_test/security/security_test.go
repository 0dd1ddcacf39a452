//go:build integration

// Package security_test runs the worker's pipeline (redisconn.Connect, the
// throttle engine, an asynq client and server with the throttle middleware)
// as the least-privilege ACL user that config.yaml recommends, on real
// redis-servers with ACL users and TLS only, and checks that the server
// denied nothing the pipeline needed and everything else.
package security_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/fleet"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/lua"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

const (
	aclUser     = "throttler"
	aclPassword = "acl-test-password"
)

// recommendedACL returns the rules of the ACL user config.yaml recommends,
// joined onto one line, with the test's password for CHANGE-ME.
func recommendedACL(t *testing.T) string {
	t.Helper()
	return redistest.RecommendedACL(t, "../../config.yaml", aclUser, aclPassword)
}

// setup is one way of reaching Redis: the server(s), an admin client that
// observes, and the config.Redis the pipeline connects with.
type setup struct {
	admin redis.UniversalClient
	redis config.Redis
}

func TestPipelineWithRecommendedACL(t *testing.T) {
	rules := recommendedACL(t)
	users := []string{rules}
	tests := []struct {
		name  string
		setup func(t *testing.T) setup
	}{
		{"ACL user", func(t *testing.T) setup {
			s := redistest.StartWith(t, redistest.Options{Users: users})
			r := config.Default().Redis
			r.URL = s.URL(aclUser, aclPassword)
			return setup{s.Client(t), r}
		}},
		{"ACL user over TLS", func(t *testing.T) setup {
			s := redistest.StartWith(t, redistest.Options{Users: users, TLS: true})
			r := config.Default().Redis
			r.URL = s.URL("", "") + "/0"
			r.Username, r.Password = aclUser, aclPassword
			r.TLS = config.TLS{CAFile: s.TLS.CAFile}
			return setup{s.Client(t), r}
		}},
		{"ACL user without function|load, library loaded by an admin", func(t *testing.T) setup {
			rules := strings.Replace(rules, " +function|load", "", 1)
			if !strings.Contains(rules, " +fcall ") {
				t.Fatalf("the recommended ACL lost +fcall: %s", rules)
			}
			s := redistest.StartWith(t, redistest.Options{Users: []string{rules}})
			admin := s.Client(t)
			if err := admin.FunctionLoad(context.Background(), lua.Functions().Source).Err(); err != nil {
				t.Fatalf("FUNCTION LOAD as the admin: %v", err)
			}
			r := config.Default().Redis
			r.URL = s.URL(aclUser, aclPassword)
			return setup{admin, r}
		}},
		{"ACL user on a TLS cluster", func(t *testing.T) setup {
			c := redistest.StartClusterWith(t, 3, 0, redistest.Options{Users: users, TLS: true})
			r := config.Default().Redis
			r.URL, r.Cluster = "", c.Addrs()
			r.Username, r.Password = aclUser, aclPassword
			r.TLS = config.TLS{Enabled: true, CAFile: c.Masters[0].TLS.CAFile}
			return setup{c.Client(t), r}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			su := tt.setup(t)
			c := config.Default()
			c.Redis = su.redis
			if err := c.Validate(); err != nil {
				t.Fatalf("the test's config is not valid: %v", err)
			}
			runPipeline(t, su)
		})
	}
}

// runPipeline admits and releases with the throttle, then enqueues and
// processes notifications through asynq and the throttle middleware, all as
// the ACL user, and checks the server's ACL log.
func runPipeline(t *testing.T, su setup) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb, closeRedis, err := redisconn.Connect(ctx, su.redis)
	if err != nil {
		t.Fatalf("Connect as %s: %v", su.redis, err)
	}
	defer closeRedis()

	quota, err := throttle.NewQuota("mkt", throttle.Window{Limit: 1, Per: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := throttle.NewBucket("gw", 1, 100) // slots of 1s: e1 holds its slot when it is released
	if err != nil {
		t.Fatal(err)
	}
	lim, err := throttle.New(rdb, throttle.Options{Prefix: su.redis.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	checkEngine(ctx, t, lim, quota, bucket)

	var mu sync.Mutex
	sent := map[string]string{} // task ID -> recipient
	th := &jobs.Throttle{
		Limiter: lim,
		Rules: jobs.Rules{Policies: map[string]*throttle.Quota{"mkt": quota}, Providers: map[string]jobs.Route{"gw": {Bucket: bucket, Provider: providers.Func(func(_ context.Context, m providers.Message) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			sent[m.ID] = m.Recipient
			return "", nil
		})}}},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              4,
		IsFailure:                jobs.IsFailure,
		RetryDelayFunc:           jobs.RetryDelay(0),
		DelayedTaskCheckInterval: 200 * time.Millisecond,
		LogLevel:                 asynq.FatalLevel,
	})
	// The hand-over of dead workers' tasks runs as the worker's does.
	rec := fleet.New(rdb, []string{"default"}, fleet.Options{Prefix: su.redis.Prefix, Log: th.Log})
	th.Fleet = rec
	recCtx, stopRec := context.WithCancel(ctx)
	recDone := make(chan error, 1)
	go func() { recDone <- rec.Run(recCtx) }()
	mux := asynq.NewServeMux()
	mux.Use(rec.Middleware)
	mux.Handle(message.TaskType, th)
	if err := srv.Start(mux); err != nil {
		t.Fatalf("asynq server: %v", err)
	}
	defer srv.Shutdown()
	client := asynq.NewClientFromRedisClient(rdb)

	// Recipients that try to reach alice's keys get quotas of their own:
	// each is delivered once. Alice gets one of her two messages, n0 or
	// "again" (4 handlers run at once, so either may reach the quota
	// first), and the other is deferred.
	recipients := []string{"alice", "alice}:q:mkt", "{alice}", "alice%7D", "x}:q:{alice"}
	want := map[string]string{}
	for i, r := range recipients {
		id := fmt.Sprintf("n%d", i)
		enqueue(t, client, id, r)
		want[id] = r
	}
	enqueue(t, client, "again", "alice")
	insp := asynq.NewInspectorFromRedisClient(su.admin)
	deferred := func() string { // the alice task not sent, "" while both or neither are
		mu.Lock()
		defer mu.Unlock()
		_, first := sent["n0"]
		_, second := sent["again"]
		switch {
		case first && !second:
			return "again"
		case second && !first:
			return "n0"
		}
		return ""
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		done := len(sent) == len(want)
		mu.Unlock()
		late := deferred()
		var info *asynq.TaskInfo
		var err error
		if late != "" {
			info, err = insp.GetTaskInfo("default", late)
		}
		if done && late != "" && err == nil && info.State == asynq.TaskStateRetry {
			if info.Retried != 0 || !strings.Contains(info.LastErr, "throttled") {
				t.Errorf("deferred task %s: retried %d, last error %q; want a throttle deferral that used no retry", late, info.Retried, info.LastErr)
			}
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("sent %v, want %v with one of n0 and again; the other message to alice: %+v, %v", sent, want, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	if _, ok := sent["again"]; ok {
		want["again"], want["n0"] = "alice", ""
	}
	for id, r := range want {
		if sent[id] != r {
			t.Errorf("task %s: sent to %q, want %q", id, sent[id], r)
		}
	}
	mu.Unlock()
	srv.Shutdown()
	stopRec()
	<-recDone
	checkReap(ctx, t, su, rec)

	checkACLLog(ctx, t, su.admin)
	checkFunctionsUsed(ctx, t, su.admin)
	checkDenied(ctx, t, rdb)
}

// checkFunctionsUsed checks that the throttle ran as a function (FCALL),
// not through its fallback to scripts, which a denied FCALL would trigger.
func checkFunctionsUsed(ctx context.Context, t *testing.T, admin redis.UniversalClient) {
	t.Helper()
	var mu sync.Mutex
	calls := 0
	each := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
				var n int
				fmt.Sscanf(rest, "%d", &n)
				mu.Lock()
				calls += n
				mu.Unlock()
			}
		}
		return nil
	}
	var err error
	switch c := admin.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Client:
		err = each(ctx, c)
	}
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	if calls == 0 {
		t.Error("no FCALL ran: the throttle fell back to scripts")
	}
}

// checkEngine admits, denies and releases directly through the limiter.
func checkEngine(ctx context.Context, t *testing.T, lim *throttle.Limiter, q *throttle.Quota, b *throttle.Bucket) {
	t.Helper()
	req := func(id string) throttle.Request {
		return throttle.Request{ID: id, Takes: []throttle.Take{{Rule: q, Subject: "engine"}, {Rule: b, Subject: "gw"}}}
	}
	if d, err := lim.Admit(ctx, req("e1")); err != nil || !d.Allowed() {
		t.Fatalf("Admit e1: %+v, %v; want allowed", d, err)
	}
	if d, err := lim.Admit(ctx, req("e2")); err != nil || d.Allowed() {
		t.Fatalf("Admit e2: %+v, %v; want denied by the quota", d, err)
	}
	if n, err := lim.Release(ctx, req("e1")); err != nil || n != 2 {
		t.Fatalf("Release e1: %d, %v; want 2 takes given back", n, err)
	}
	if d, err := lim.Admit(ctx, req("e2")); err != nil || !d.Allowed() {
		t.Fatalf("Admit e2 after the release: %+v, %v; want allowed", d, err)
	}
}

func enqueue(t *testing.T, client *asynq.Client, id, recipient string) {
	t.Helper()
	task, err := message.NewTask(message.Notification{Recipient: recipient, Policy: "mkt", Provider: "gw", Template: "welcome"},
		id, asynq.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(task); err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
}

// checkACLLog fails the test for every command, key or channel the server
// denied, on any node: the pipeline must not need more than the ACL gives,
// even where a client ignores the error.
func checkACLLog(ctx context.Context, t *testing.T, admin redis.UniversalClient) {
	t.Helper()
	each := func(ctx context.Context, c *redis.Client) error {
		entries, err := c.ACLLog(ctx, 100).Result()
		if err != nil {
			return err
		}
		for _, e := range entries {
			t.Errorf("%s: denied %s %q (%s) to %s, %d times", c.Options().Addr, e.Reason, e.Object, e.Context, e.Username, e.Count)
		}
		return nil
	}
	var err error
	switch c := admin.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, each)
	case *redis.Client:
		err = each(ctx, c)
	}
	if err != nil {
		t.Fatalf("ACL LOG: %v", err)
	}
}

// checkDenied checks that the ACL user cannot step outside what it needs.
func checkDenied(ctx context.Context, t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	tests := []struct {
		name string
		cmd  []any
	}{
		{"another application's key", []any{"set", "billing:invoice:1", "x"}},
		{"reading another application's key", []any{"get", "session:abc"}},
		{"key listing", []any{"keys", "*"}},
		{"flush", []any{"flushall"}},
		{"config", []any{"config", "get", "requirepass"}},
		{"acl", []any{"acl", "list"}},
		{"another channel", []any{"publish", "other", "x"}},
		{"database switch", []any{"select", "1"}},
		{"script flush", []any{"script", "flush"}},
		{"function flush", []any{"function", "flush"}},
		{"other clients", []any{"client", "list"}},
		{"config change", []any{"config", "set", "maxmemory", "1"}},
		{"a script touching another key", []any{"eval", "return redis.call('set', KEYS[1], 'x')", "1", "other:key"}},
	}
	for _, tt := range tests {
		err := rdb.Do(ctx, tt.cmd...).Err()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "No permissions") {
			t.Errorf("%s (%v): %v, want NOPERM", tt.name, tt.cmd, err)
		}
	}
}

// checkReap has the recovery's reaper, as the ACL user, hand over the task
// of a worker that died (written by the admin): every command of its
// script must be allowed.
func checkReap(ctx context.Context, t *testing.T, su setup, rec *fleet.Member) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(su.admin)
	if _, err := client.Enqueue(asynq.NewTask(message.TaskType, nil), asynq.TaskID("orphan")); err != nil {
		t.Fatal(err)
	}
	// As asynq's dequeue leaves a task (internal/asynqdb), held by a worker
	// silent for a minute.
	q, prefix := "default", su.redis.Prefix
	steps := []error{
		su.admin.LRem(ctx, asynqdb.PendingKey(q), 0, "orphan").Err(),
		su.admin.LPush(ctx, asynqdb.ActiveKey(q), "orphan").Err(),
		su.admin.HSet(ctx, asynqdb.TaskKey(q, "orphan"), "state", asynqdb.StateActive).Err(),
		su.admin.ZAdd(ctx, asynqdb.LeaseKey(q), redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: "orphan"}).Err(),
		su.admin.SAdd(ctx, prefix+"recovery:{"+q+"}:held:dead", "orphan:1").Err(),
		su.admin.ZAdd(ctx, prefix+"recovery:{"+q+"}:beats", redis.Z{Score: float64(time.Now().Add(-time.Minute).UnixMilli()), Member: "dead"}).Err(),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	hs, err := rec.Reap(ctx, q)
	if err != nil {
		t.Fatalf("reap as the ACL user: %v", err)
	}
	if len(hs) != 1 || len(hs[0].Tasks) != 1 {
		t.Errorf("reap: %+v, want the orphan handed over", hs)
	}
}
