//go:build integration

package redisguard

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
)

var outageFlag = flag.Duration("outage", 5*time.Second,
	"how long Redis stays down in the outage test and benchmark (the report used 30s)")

func TestUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	up := srv.Client(t)
	ctx := context.Background()
	closedPort := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}()
	down := redis.NewClient(&redis.Options{Addr: closedPort, MaxRetries: -1, DialerRetries: 1})
	defer down.Close()
	closed := redis.NewClient(&redis.Options{Addr: srv.Addr})
	_ = closed.Close()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, listenErr := net.Listen("tcp", "256.0.0.1:1")
	reply := func(msg string) error {
		t.Helper()
		err := up.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, msg).Err()
		if err == nil || !strings.HasPrefix(err.Error(), msg) {
			t.Fatalf("script gave %v, want the reply %q", err, msg)
		}
		return err
	}

	tests := []struct {
		name                     string
		err                      error
		unreachable, unavailable bool
	}{
		{"connection refused", down.Ping(ctx).Err(), true, true},
		{"loading", reply("LOADING Redis is loading the dataset in memory"), true, true},
		{"no master", reply("MASTERDOWN Link with MASTER is down"), true, true},
		{"out of memory", reply("OOM command not allowed when used memory > 'maxmemory'."), false, true},
		{"password refused", reply("WRONGPASS invalid username-password pair"), false, true},
		{"read-only replica", reply("READONLY You can't write against a read only replica."), false, true},
		{"nil reply", up.Get(ctx, "missing").Err(), false, false},
		{"no script", up.EvalSha(ctx, "0000000000000000000000000000000000000000", nil).Err(), false, false},
		{"wrong type", func() error { up.Set(ctx, "s", 1, 0); return up.LPush(ctx, "s", 1).Err() }(), false, false},
		{"closed client", closed.Ping(ctx).Err(), false, false},
		{"cancelled", up.Ping(cancelled).Err(), false, false},
		{"listen", listenErr, false, false},
		{"nil", nil, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil && tc.name != "nil" {
				t.Fatal("the case produced no error")
			}
			if got := Unreachable(tc.err); got != tc.unreachable {
				t.Errorf("Unreachable(%v) = %t, want %t", tc.err, got, tc.unreachable)
			}
			if got := Unavailable(tc.err); got != tc.unavailable {
				t.Errorf("Unavailable(%v) = %t, want %t", tc.err, got, tc.unavailable)
			}
		})
	}
}

// lines is a log sink that counts lines.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *lines) count() int { return strings.Count(l.String(), "\n") }

// outage is what one run of runOutage saw.
type outage struct {
	cpu     time.Duration // process CPU time while Redis was unavailable
	down    time.Duration // how long Redis was unavailable
	lines   int           // log lines written meanwhile
	resumed time.Duration // from Redis's return to the next task processed
	log     string
}

// A fault makes a running redis-server unavailable and then fixes it.
type fault struct {
	name       string
	maxRetries int // the worker client's MaxRetries
	poolSize   int // and PoolSize (0: go-redis's 10 per CPU)
	password   string
	cause, fix func(tb testing.TB, srv *redistest.Server)
}

var faults = []fault{{
	// Redis stopped, the client as go-redis comes: its retries back off
	// (5 dial attempts, then 3 command retries at 8-512ms), so no spin.
	name:  "stopped",
	cause: func(_ testing.TB, srv *redistest.Server) { srv.Stop() },
	fix:   func(tb testing.TB, srv *redistest.Server) { srv.Restart(tb) },
}, {
	// Redis stopped, a client without command retries (max_retries=-1 in
	// a redis URL): once the pool has seen PoolSize failed dials (each
	// takes ~0.4s of go-redis's dial retries) it fails every call at once,
	// and asynq's processor loop spins. A small pool makes that happen
	// within 2s; with the default pool (20 here) it takes ~8s.
	name:       "stopped, no retries",
	maxRetries: -1,
	poolSize:   4,
	cause:      func(_ testing.TB, srv *redistest.Server) { srv.Stop() },
	fix:        func(tb testing.TB, srv *redistest.Server) { srv.Restart(tb) },
}, {
	// The password rotated under a running worker: every reconnect is
	// refused at once, and asynq's processor loop spins.
	name:     "password refused",
	password: "secret",
	cause: func(tb testing.TB, srv *redistest.Server) {
		admin := srv.Client(tb)
		ctx := context.Background()
		if err := admin.ConfigSet(ctx, "requirepass", "rotated").Err(); err != nil {
			tb.Fatal(err)
		}
		_ = admin.ClientKillByFilter(ctx, "TYPE", "normal").Err()
	},
	fix: func(tb testing.TB, srv *redistest.Server) {
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "rotated"})
		defer admin.Close()
		if err := admin.ConfigSet(context.Background(), "requirepass", "secret").Err(); err != nil {
			tb.Fatal(err)
		}
	},
}}

// runOutage runs an asynq server (with the guard, or as asynq comes) on a
// redis-server, makes Redis unavailable by f for down, measures this
// process's CPU time and log lines meanwhile, fixes Redis and waits for the
// server to process a task again.
func runOutage(tb testing.TB, guarded bool, f fault, down time.Duration, opts Options) outage {
	tb.Helper()
	var extra []string
	if f.password != "" {
		extra = append(extra, "requirepass "+f.password)
	}
	srv := redistest.Start(tb, extra...)
	producer := asynq.NewClientFromRedisClient(srv.Client(tb))
	var sink lines
	log := slog.New(slog.NewTextHandler(&sink, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: f.password, MaxRetries: f.maxRetries, PoolSize: f.poolSize})
	defer rdb.Close()
	cfg := asynq.Config{Concurrency: 4, LogLevel: asynq.WarnLevel, DelayedTaskCheckInterval: time.Second}
	if guarded {
		g := New(log, opts)
		g.Install(rdb)
		cfg.Logger = g.AsynqLogger()
		redis.SetLogger(g.RedisLogger())
	} else {
		cfg.Logger = plainLogger{log}
		redis.SetLogger(plainLogger{log})
	}
	defer redis.SetLogger(plainLogger{slog.Default()})
	done := make(chan string, 16)
	worker := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := worker.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		done <- string(t.Payload())
		return nil
	})); err != nil {
		tb.Fatal(err)
	}
	defer worker.Shutdown()
	awaitTask(tb, producer, done, "before")

	f.cause(tb, srv)
	before, start := cpuTime(tb), time.Now()
	linesBefore := sink.count()
	time.Sleep(down) // the outage's length is what is under test
	o := outage{cpu: cpuTime(tb) - before, down: time.Since(start), lines: sink.count() - linesBefore}
	f.fix(tb, srv)
	fixed := time.Now()
	awaitTask(tb, producer, done, "after")
	o.resumed = time.Since(fixed)
	o.log = sink.String()
	return o
}

// awaitTask enqueues a task and waits for the worker to process it.
func awaitTask(tb testing.TB, producer *asynq.Client, done <-chan string, name string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The producer's connection may have been killed by the fault.
		_, err := producer.Enqueue(asynq.NewTask("probe", []byte(name)))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("enqueue %s: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	timeout := time.After(time.Until(deadline))
	for {
		select {
		case got := <-done:
			if got == name {
				return
			}
		case <-timeout:
			tb.Fatalf("task %q not processed within 30s", name)
		}
	}
}

// cpuTime returns the user+system CPU time of this process so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// plainLogger is asynq's and go-redis's logger without the guard, for comparison.
type plainLogger struct{ log *slog.Logger }

func (l plainLogger) Debug(args ...any) { l.log.Debug(fmt.Sprint(args...)) }
func (l plainLogger) Info(args ...any)  { l.log.Info(fmt.Sprint(args...)) }
func (l plainLogger) Warn(args ...any)  { l.log.Warn(fmt.Sprint(args...)) }
func (l plainLogger) Error(args ...any) { l.log.Error(fmt.Sprint(args...)) }
func (l plainLogger) Fatal(args ...any) { l.log.Error(fmt.Sprint(args...)) }

func (l plainLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}

// TestOutageIsQuietAndResumes makes Redis unavailable under a guarded asynq
// server in each way of faults: the process stays up, uses little CPU, logs
// a bounded number of lines, and processes tasks again once Redis is back.
// Unguarded, "stopped, no retries" and "password refused" use 20-30% of a
// core over 5s (about half a core once the spin is established: see
// BenchmarkOutage), so the CPU bound (10%) fails without the guard; every
// fault's log bound does.
func TestOutageIsQuietAndResumes(t *testing.T) {
	logEvery := 2 * time.Second
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			o := runOutage(t, true, f, *outageFlag, Options{LogEvery: logEvery})
			t.Logf("guarded: %s down, %.3f CPU-s (%.1f%% of a core), %d log lines, resumed %s after the fix",
				o.down.Round(time.Millisecond), o.cpu.Seconds(), 100*o.cpu.Seconds()/o.down.Seconds(), o.lines, o.resumed.Round(time.Millisecond))
			if limit := o.down / 10; o.cpu > limit {
				t.Errorf("%.2f CPU-s in %s of outage, want at most %.2f", o.cpu.Seconds(), o.down, limit.Seconds())
			}
			// One line as the outage starts, one per logEvery, and a few
			// go-redis lines written before the first call failed.
			if limit := int(o.down/logEvery) + 4; o.lines > limit {
				t.Errorf("%d log lines in %s of outage, want at most %d:\n%s", o.lines, o.down, limit, o.log)
			}
			for _, want := range []string{"redis unavailable", "redis available again"} {
				if !strings.Contains(o.log, want) {
					t.Errorf("log has no %q line:\n%s", want, o.log)
				}
			}
		})
	}
}

// BenchmarkOutage measures, with and without the guard, the CPU an asynq
// server burns while its Redis is unavailable, and its log lines. One
// iteration takes -outage (default 5s): run it with -benchtime=1x.
func BenchmarkOutage(b *testing.B) {
	for _, f := range faults {
		for _, guarded := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/guard=%t", strings.ReplaceAll(f.name, " ", "_"), guarded), func(b *testing.B) {
				var cpu, down time.Duration
				var lines int
				for range b.N {
					o := runOutage(b, guarded, f, *outageFlag, Options{})
					cpu, down, lines = cpu+o.cpu, down+o.down, lines+o.lines
				}
				b.ReportMetric(cpu.Seconds()/down.Seconds(), "cpu-s/s")
				b.ReportMetric(float64(lines)/down.Seconds()*60, "log-lines/min")
			})
		}
	}
}

// TestConnectWaitsForRedis starts a worker's connection before its Redis:
// Connect waits, logging, and returns a guarded client once Redis answers.
// Errors that waiting cannot fix return at once.
func TestConnectWaitsForRedis(t *testing.T) {
	srv := redistest.Start(t, "requirepass secret")
	srv.Stop()
	var sink lines
	g := New(slog.New(slog.NewTextHandler(&sink, nil)), Options{MaxDelay: 200 * time.Millisecond})
	connect := func(password string) func(context.Context) (redis.UniversalClient, func() error, error) {
		return func(ctx context.Context) (redis.UniversalClient, func() error, error) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: password, MaxRetries: -1, DialerRetries: 1})
			if err := rdb.Ping(ctx).Err(); err != nil {
				_ = rdb.Close()
				return nil, nil, err
			}
			return rdb, rdb.Close, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rdb redis.UniversalClient
	var closeRedis func() error
	var err error
	connected := make(chan struct{})
	go func() {
		defer close(connected)
		rdb, closeRedis, err = g.Connect(ctx, connect("secret"))
	}()
	time.Sleep(time.Second) // Connect must keep waiting through a second of no Redis
	srv.Restart(t)
	<-connected
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer closeRedis()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Errorf("the client Connect returned: %v", err)
	}
	if log := sink.String(); !strings.Contains(log, "redis unavailable") || !strings.Contains(log, "redis available again") {
		t.Errorf("log does not tell of the wait:\n%s", log)
	}

	// Were a refused password waited on, this would end with ctx, "gave up".
	if _, _, err := g.Connect(ctx, connect("wrong")); err == nil ||
		!strings.HasPrefix(err.Error(), "WRONGPASS") {
		t.Errorf("Connect with a wrong password: %v, want WRONGPASS at once", err)
	}

	srv.Stop()
	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancelShort()
	if _, _, err := g.Connect(short, connect("secret")); err == nil ||
		!strings.Contains(err.Error(), "gave up") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Connect until the context ends: %v, want the last connection error", err)
	}
}
