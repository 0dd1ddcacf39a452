package redisconn

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestReloaderAsksOnlyWhenUnreachable: a reload is asked for when a call
// could not reach its node, not when the node answered (an error reply
// included) or the caller gave up.
func TestReloaderAsksOnlyWhenUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	timedOut := &net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"answered", nil, 0},
		{"nil reply", redis.Nil, 0},
		{"caller cancelled", context.Canceled, 0},
		{"caller's deadline", context.DeadlineExceeded, 0},
		{"client closed", redis.ErrClosed, 0},
		{"connection refused", refused, 1},
		{"read timed out", timedOut, 1},
		{"connection closed under the call", io.EOF, 1},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), 1},
		{"pool exhausted waiting for the node", redis.ErrPoolTimeout, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n int
			r := &reloader{reload: func() { n++ }, gap: time.Second}
			r.observe(tt.err, time.Unix(100, 0))
			if n != tt.want {
				t.Errorf("observe(%v): %d reloads, want %d", tt.err, n, tt.want)
			}
		})
	}
}

// TestReloaderGap: at most one reload per gap, however the failed calls
// fall.
func TestReloaderGap(t *testing.T) {
	const gap = 500 * time.Millisecond
	t0 := time.Unix(100, 0)
	tests := []struct {
		name  string
		after []time.Duration // each failed call's time after t0
		want  int
	}{
		{"one call", []time.Duration{0}, 1},
		{"a burst", []time.Duration{0, time.Millisecond, 100 * time.Millisecond, gap - 1}, 1},
		{"one per gap", []time.Duration{0, gap, 2 * gap, 3 * gap}, 4},
		{"calls every 100ms for 2s", every(100*time.Millisecond, 2*time.Second), 4},
		{"apart", []time.Duration{0, time.Minute}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n int
			r := &reloader{reload: func() { n++ }, gap: gap}
			for _, d := range tt.after {
				r.observe(io.EOF, t0.Add(d))
			}
			if n != tt.want {
				t.Errorf("%d reloads, want %d", n, tt.want)
			}
		})
	}
}

// TestReloaderConcurrent: the callers that fail at once, as a worker's
// do when a master dies, ask for one reload between them.
func TestReloaderConcurrent(t *testing.T) {
	var n atomic.Int32
	r := &reloader{reload: func() { n.Add(1) }, gap: time.Second}
	now := time.Unix(100, 0)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() { r.observe(io.EOF, now) })
	}
	wg.Wait()
	if got := n.Load(); got != 1 {
		t.Errorf("64 calls failing at once: %d reloads, want 1", got)
	}
}

// every returns 0, step, 2·step, ... below span.
func every(step, span time.Duration) []time.Duration {
	var out []time.Duration
	for d := time.Duration(0); d < span; d += step {
		out = append(out, d)
	}
	return out
}

// timeoutError is a net.Error that timed out, as a read deadline's is.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
