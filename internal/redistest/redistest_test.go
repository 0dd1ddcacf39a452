//go:build integration

package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestBinary(t *testing.T) {
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(bin, "redis-server") {
		t.Fatalf("Binary() = %q", bin)
	}
}

func TestStartStopRestart(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	if !strings.HasPrefix(s.Addr, "127.0.0.1:") {
		t.Fatalf("Addr = %q", s.Addr)
	}
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("get = %q, %v", got, err)
	}

	s.Stop()
	s.Stop() // safe twice
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if conn, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("port still accepts connections after Stop")
	}

	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("get after restart: %v, want redis.Nil (no persistence)", err)
	}
}

func TestKillAndExtraConfig(t *testing.T) {
	ctx := context.Background()
	s := Start(t, "requirepass secret", "tls-port 0")
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping with password: %v", err)
	}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("ping without password: %v, want NOAUTH", err)
	}

	s.Kill()
	if s.Running() {
		t.Fatal("running after Kill")
	}
	s.Restart(t)
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
}

func TestStartFailureShowsLog(t *testing.T) {
	msg := fatalMessage(t, func(tb TB) { Start(tb, "no-such-directive 1") })
	for _, want := range []string{"exited before answering PING", "FATAL CONFIG FILE ERROR", "no-such-directive"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Fatalf message lacks %q:\n%s", want, msg)
		}
	}
}

func TestStartClusterRejectsTooFewMasters(t *testing.T) {
	msg := fatalMessage(t, func(tb TB) { StartCluster(tb, 2, 1) })
	if !strings.Contains(msg, ">= 3 masters") {
		t.Fatalf("Fatalf message = %q", msg)
	}
}

func TestProbeRejectsForeignServer(t *testing.T) {
	s := Start(t)
	if err := probe(s.Addr, "/elsewhere/redis.conf", access{}); !errors.Is(err, errWrongServer) {
		t.Fatalf("probe = %v, want errWrongServer", err)
	}
}

func TestLaunchDetectsTakenPort(t *testing.T) {
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	s := &Server{Addr: l.Addr().String(), Port: port, Dir: dir, bin: bin, conf: dir + "/" + confFile}
	if err := writeConfig(s.conf, dir, port, false, &security{}); err != nil {
		t.Fatal(err)
	}
	if taken, err := s.launch(); !taken || err == nil {
		t.Fatalf("launch on a taken port = %t, %v; want taken", taken, err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartCluster(t, 3, 1)
	if len(c.Masters) != 3 || len(c.Replicas) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("got %d masters, %d replicas", len(c.Masters), len(c.Replicas))
	}
	cc := c.Client(t)
	setKeys(ctx, t, cc, 100)
	for i := range 100 {
		key := fmt.Sprintf("key:%d", i)
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != key {
			t.Fatalf("get %s = %q, %v", key, got, err)
		}
	}
	var masters, total atomic.Int64
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if n > 0 {
			masters.Add(1)
		}
		total.Add(n)
		return err
	})
	if err != nil || masters.Load() != 3 || total.Load() != 100 {
		t.Fatalf("keys on %d masters, %d in total (%v); want 3 and 100", masters.Load(), total.Load(), err)
	}
}

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartCluster(t, 3, 1)
	cc := c.Client(t)
	setKeys(ctx, t, cc, 30)

	old := c.Masters[0]
	nm := c.Failover(t, 0)
	if nm == old || c.Masters[0] != nm || c.Replicas[0] != old {
		t.Fatalf("layout not updated: new %s, Masters[0] %s, Replicas[0] %s", nm.Addr, c.Masters[0].Addr, c.Replicas[0].Addr)
	}
	if role := role(ctx, t, nm); role != "master" {
		t.Fatalf("new master role = %q", role)
	}
	if role := role(ctx, t, old); role != "slave" {
		t.Fatalf("old master role = %q", role)
	}

	// The client learns the new slot map on its next refresh: quick on an
	// idle machine, seconds on a busy one.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		err := cc.Set(ctx, "after-failover", i, 0).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("set after failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range 30 {
		key := fmt.Sprintf("key:%d", i)
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != key {
			t.Fatalf("get %s after failover = %q, %v", key, got, err)
		}
	}
}

// setKeys sets key:0 .. key:n-1 to their own names.
func setKeys(ctx context.Context, t *testing.T, cc *redis.ClusterClient, n int) {
	t.Helper()
	for i := range n {
		key := fmt.Sprintf("key:%d", i)
		if err := cc.Set(ctx, key, key, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
	}
}

// role returns the replication role a server reports.
func role(ctx context.Context, t *testing.T, s *Server) string {
	t.Helper()
	info, err := s.Client(t).Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("info replication on %s: %v", s.Addr, err)
	}
	return infoField(info, "role")
}

// recorder is a TB whose Fatalf records the message and ends the goroutine.
type recorder struct {
	*testing.T
	msg string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatalMessage runs f with a recorder and returns what it passed to Fatalf.
func fatalMessage(t *testing.T, f func(TB)) string {
	t.Helper()
	r := &recorder{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	if r.msg == "" {
		t.Fatal("Fatalf was not called")
	}
	return r.msg
}
