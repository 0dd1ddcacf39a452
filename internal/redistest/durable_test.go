//go:build integration

package redistest

import (
	"context"
	"testing"
)

// TestStartDurableKeepsDataAcrossKill: a write acknowledged before SIGKILL
// is there after Restart, and a plain Start server loses it.
func TestStartDurableKeepsDataAcrossKill(t *testing.T) {
	for _, durable := range []bool{true, false} {
		start := Start
		if durable {
			start = StartDurable
		}
		s := start(t)
		ctx := context.Background()
		if err := s.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		s.Kill()
		s.Restart(t)
		n, err := s.Client(t).Exists(ctx, "k").Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int64{true: 1, false: 0}[durable]; n != want {
			t.Errorf("durable %t: %d keys after kill and restart, want %d", durable, n, want)
		}
	}
}
