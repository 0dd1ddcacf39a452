package redisconn

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

func TestRedactURL(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"embedded", "embedded", "embedded"},
		{"no credentials", "redis://cache:6379/0", "redis://cache:6379/0"},
		{"user only", "redis://app@cache:6379/0", "redis://app@cache:6379/0"},
		{"user and password", "redis://app:s3cret@cache:6379/0", "redis://app:xxxxx@cache:6379/0"},
		{"password only", "redis://:s3cret@cache:6379", "redis://:xxxxx@cache:6379"},
		{"empty password", "redis://app:@cache", "redis://app:xxxxx@cache"},
		{"tls", "rediss://app:s3cret@cache:6380/1", "rediss://app:xxxxx@cache:6380/1"},
		{"escaped characters", "redis://app:p%40ss%2Fw@cache", "redis://app:xxxxx@cache"},
		{"unescaped @ and colon", "redis://app:p@ss:w@cache:6379", "redis://app:xxxxx@cache:6379"},
		{"unescaped slash, not a URL", "redis://app:s3/cret@cache:6379", "redis://app:xxxxx@cache:6379"},
		{"password query parameter", "unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=xxxxx"},
		{"no scheme", "app:s3cret@cache:6379", "app:xxxxx@cache:6379"},
		{"not a URL", "cache:6379", "cache:6379"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RedactURL(tt.in); got != tt.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestPasswordNeverInErrors feeds bad Redis URLs holding a password to
// Connect (config's tests feed them to Parse and REDIS_URL).
func TestPasswordNeverInErrors(t *testing.T) {
	const secret = "s3cr3t"
	for _, u := range []string{
		"redis://app:" + secret + "@cache:port/0",
		"redis://app:" + secret + "@cache:6379/zero",
		"http://app:" + secret + "@cache:6379",
		"redis://app:" + secret + "@cache:6379/0?bogus=1",
		"redis://app:" + secret + "/x@cache:6379/0",
		"redis://app:" + secret + ":x@cache:port",
		"redis://cache:6379/0?password=" + secret,
		"redis://app:" + secret + "%zz@cache:6379/0",
		"redis://app:" + secret + "@cache\n:6379/0",
	} {
		if _, _, err := Connect(context.Background(), Config{URL: u}); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("Connect(%q) = %v, want an error without the password", u, err)
		}
	}
	t.Run("refused connection", func(t *testing.T) {
		r := Config{URL: "redis://app:" + secret + "@" + freeAddr(t) + "/0"}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _, err := Connect(ctx, r)
		if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "app:xxxxx@") {
			t.Errorf("Connect error = %v, want one with the URL redacted", err)
		}
	})
}

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestEmbeddedServeConnect starts the embedded server as a worker does and
// reaches it from a second client as enqueue does.
func TestEmbeddedServeConnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := Config{URL: Embedded, EmbeddedAddr: DefaultEmbeddedAddr, Prefix: "throttle:"}
	r.EmbeddedAddr = freeAddr(t)

	worker, stop, err := Serve(ctx, r)
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	defer stop()
	enqueue, closeEnqueue, err := Connect(ctx, r)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer closeEnqueue()

	if err := enqueue.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING from the second client: %v", err)
	}
	if err := enqueue.Set(ctx, "greeting", "hello", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := worker.Get(ctx, "greeting").Result(); err != nil || got != "hello" {
		t.Errorf("worker reads %q, %v; want hello", got, err)
	}

	if _, _, err := Serve(ctx, r); err == nil || !strings.Contains(err.Error(), "start embedded redis on "+r.EmbeddedAddr) {
		t.Errorf("second Serve on the same address: %v, want a start error", err)
	}

	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if err := stop(); err != nil {
		t.Errorf("second stop: %v", err)
	}
	if err := enqueue.Ping(ctx).Err(); err == nil {
		t.Error("PING answered after the server stopped")
	}
}

// TestEmbeddedKeysExpire checks that TTLs count down in real time, which
// miniredis does not do by itself.
func TestEmbeddedKeysExpire(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := Config{URL: Embedded, EmbeddedAddr: freeAddr(t)}
	rdb, stop, err := Serve(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := rdb.Set(ctx, "k", "v", 500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Exists(ctx, "k").Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("key with a 500ms TTL still there after 5s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestConnectEmbeddedWithoutWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := Config{URL: Embedded, EmbeddedAddr: freeAddr(t)}
	_, _, err := Connect(ctx, r)
	want := "config: connect to redis embedded (" + r.EmbeddedAddr + ") (a worker runs the embedded server: start one first): "
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v, want it to start with %q", err, want)
	}
}
