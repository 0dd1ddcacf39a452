//go:build integration

package throttle

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/lua"
)

// The engine's Lua runs as a Redis Functions library (FCALL) where the server
// has functions, and as scripts (EVALSHA, then EVAL) where it has not. These
// tests take away what each path relies on (the library, the script cache,
// the FUNCTION commands) and require the same decisions throughout.

// quotaDance admits a, is denied b by a quota of 1 per hour, releases a and
// admits b: the same outcomes whichever way the Lua runs.
func quotaDance(t *testing.T, l *Limiter, who string) {
	t.Helper()
	q := mustQuota(t, "mkt", Window{1, time.Hour})
	b := mustBucket(t, "sms", 1, 5)
	r := func(id string) Request {
		return Request{ID: id, Takes: []Take{{Rule: q, Subject: who}, {Rule: b, Subject: "gw-" + who}}}
	}
	if d := mustAdmit(t, l, r(who+"-a")); !d.Allowed() || d.Outcome == Repeated || d.Remaining != 0 {
		t.Fatalf("%s-a: %+v, want allowed, 0 remaining", who, d)
	}
	if d := mustAdmit(t, l, r(who+"-a")); !d.Allowed() || d.Outcome != Repeated {
		t.Fatalf("%s-a again: %+v, want allowed, repeated", who, d)
	}
	d := mustAdmit(t, l, r(who+"-b"))
	if d.Allowed() || d.TakeIndex != 0 || d.Limit != "1 per 1h" || d.Delay <= 59*time.Minute || d.Delay > time.Hour {
		t.Fatalf("%s-b: %+v, want denied by 1 per 1h for about an hour", who, d)
	}
	if n, err := l.Release(ctx, r(who+"-a")); n != 2 || err != nil {
		t.Fatalf("release %s-a: %d, %v; want 2", who, n, err)
	}
	if d := mustAdmit(t, l, r(who+"-b")); !d.Allowed() || d.Outcome == Repeated {
		t.Fatalf("%s-b after the release: %+v, want allowed", who, d)
	}
	if d, err := l.Pause(ctx, b, "gw-"+who, time.Second); err != nil || d < 999*time.Millisecond || d > time.Second {
		t.Fatalf("pause: %s, %v; want the next token in 1s", d, err)
	}
}

func TestFunctionsAreLoadedOnceAndCalled(t *testing.T) {
	l, rdb := newOwnServer(t)
	quotaDance(t, l, "alice")
	quotaDance(t, l, "bob")
	calls := commandCalls(t, rdb)
	if calls["fcall"] == 0 || calls["eval"]+calls["evalsha"] != 0 {
		t.Errorf("script calls %v: want FCALL only", calls)
	}
	if calls["function|load"] != 1 {
		t.Errorf("FUNCTION LOAD ran %d times, want once", calls["function|load"])
	}
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 1 || libs[0].Name != lua.Functions().Name {
		t.Errorf("libraries %+v, want only %s", libs, lua.Functions().Name)
	}
}

// TestFunctionsComeBack takes the library away (FUNCTION FLUSH, a restart
// without persistence) between admissions: the next call loads it again and
// is decided as if nothing happened.
func TestFunctionsComeBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := mustLimiter(t, rdb)
	quotaDance(t, l, "alice")

	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	quotaDance(t, l, "bob")

	srv.Restart(t)
	quotaDance(t, l, "carol")
	// Many admissions at once, after another flush: the calls the client's
	// pipeliner sends together all find the library gone, and each is sent
	// again once it is back.
	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	q := mustQuota(t, "daily", Window{1, 24 * time.Hour})
	allowed := make([]atomic.Int32, 125) // by recipient
	var wg sync.WaitGroup
	for i := range 250 {
		wg.Go(func() {
			d, err := l.Admit(ctx, Request{ID: fmt.Sprint("t", i), Takes: []Take{{Rule: q, Subject: fmt.Sprint("r", i%125)}}})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			} else if d.Allowed() {
				allowed[i%125].Add(1)
			}
		})
	}
	wg.Wait()
	for r := range allowed {
		if n := allowed[r].Load(); n != 1 {
			t.Errorf("recipient r%d: %d of its two requests allowed, want one", r, n)
		}
	}
	if calls := commandCalls(t, rdb); calls["eval"]+calls["evalsha"] != 0 {
		t.Errorf("script calls %v: want FCALL only", calls)
	}
}

// TestScriptsWhereFunctionsAreForbidden runs the engine as a user that may
// not call functions: it falls back to scripts, and a SCRIPT FLUSH on the
// way (NOSCRIPT) costs nothing but an EVAL.
func TestScriptsWhereFunctionsAreForbidden(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{Users: []string{"app on >app-secret ~* &* +@all -fcall -fcall_ro -function"}})
	opts, err := redis.ParseURL(srv.URL("app", "app-secret"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	admin := srv.Client(t)
	l := mustLimiter(t, rdb)

	quotaDance(t, l, "alice")
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	quotaDance(t, l, "bob")
	calls := commandCalls(t, admin)
	if calls["evalsha"] == 0 || calls["eval"] == 0 {
		t.Errorf("script calls %v: want EVALSHA, and EVAL after the flush", calls)
	}
	if !l.noFunctions.Load() {
		t.Errorf("the limiter still calls functions")
	}
}

// TestEmbeddedServer runs the engine on miniredis, the embedded server of
// `redis.url: embedded`, which has no FUNCTION: the scripts run there in
// gopher-lua, and must decide the same.
func TestEmbeddedServer(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := mustLimiter(t, rdb)
	quotaDance(t, l, "alice")
	// A reservation and the repeat that returns the same moment.
	b := mustBucket(t, "push", 10, 1)
	r := func(id string) Request { return Request{ID: id, Takes: []Take{{Rule: b, Subject: "gw"}}} }
	mustAdmit(t, l, r("p1"))
	d, err := l.Admit(ctx, withWait(r("p2"), time.Second))
	if err != nil || !d.Allowed() || d.Delay <= 0 || d.Delay > 100*time.Millisecond {
		t.Fatalf("reserve p2: %+v, %v; want allowed within 100ms", d, err)
	}
	again, err := l.Admit(ctx, withWait(r("p2"), time.Second))
	if err != nil || again.Outcome != Repeated || !again.At().Equal(d.At()) {
		t.Errorf("reserve p2 again: %+v, %v; want repeated at %s", again, err, d.At())
	}
	if !l.noFunctions.Load() {
		t.Errorf("the limiter did not fall back to scripts on miniredis")
	}
}

// TestClusterFunctionsComeBack takes the library away from one master, then
// fails a master over to its replica (which has the library through
// replication) and flushes it there too: admissions on every slot go on.
func TestClusterFunctionsComeBack(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := c.Client(t)
	l := mustLimiter(t, rdb)
	// One recipient per master.
	who := []string{"alice"}
	who = append(who, subjectOnOtherMaster(t, rdb, "bob", who...))
	who = append(who, subjectOnOtherMaster(t, rdb, "carol", who...))
	n := 0
	admitAll := func(step string) {
		t.Helper()
		n++
		q := mustQuota(t, fmt.Sprint("daily", n), Window{1, 24 * time.Hour})
		for _, w := range who {
			r := Request{ID: fmt.Sprint(step, "-", w), Takes: []Take{{Rule: q, Subject: w}}}
			d, err := l.Admit(ctx, r)
			if err != nil || !d.Allowed() {
				t.Fatalf("%s: %s: %+v, %v; want allowed", step, w, d, err)
			}
			// And a second task, denied: the decisions are the engine's.
			r.ID += "-again"
			if d, err := l.Admit(ctx, r); err != nil || d.Allowed() {
				t.Fatalf("%s: %s again: %+v, %v; want denied", step, w, d, err)
			}
		}
	}
	admitAll("first")
	// A task on every master, released after one of them lost the library:
	// its calls go in one pipeline, and the one that failed is sent again.
	sq, spread := mustQuota(t, "spread", Window{1, 24 * time.Hour}), Request{ID: "spread"}
	for _, w := range who {
		spread.Takes = append(spread.Takes, Take{Rule: sq, Subject: w})
	}
	if d := mustAdmit(t, l, spread); !d.Allowed() {
		t.Fatalf("spread: %+v, want allowed", d)
	}
	node := masterFor(t, rdb, keyspace.Quota(keyspace.Tag(DefaultPrefix, who[1]), "daily1"))
	if err := node.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := l.Release(ctx, spread); n != len(who) || err != nil {
		t.Fatalf("release spread after a flush: %d, %v; want %d takes back", n, err, len(who))
	}
	admitAll("after a flush")

	newMaster := c.Failover(t, 0)
	admitAll("after a failover")
	if err := newMaster.Client(t).FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	admitAll("after a failover and a flush")
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		libs, err := m.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		if err != nil {
			return err
		}
		if len(libs) != 1 || libs[0].Name != lua.Functions().Name {
			return fmt.Errorf("%s has libraries %+v", m.Options().Addr, libs)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
