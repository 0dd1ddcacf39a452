package jobs

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/providers"
)

// shared is the redis-server the package's tests share, each test in a
// database of its own; tests that kill or restart Redis start their own.
var shared *redistest.Shared

func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }

// sendErrorf is a provider's failed send with what to do about it.
func sendErrorf(o providers.Outcome, after time.Duration, format string, args ...any) *providers.SendError {
	return &providers.SendError{Outcome: o, RetryAfter: after, Err: fmt.Errorf(format, args...)}
}
