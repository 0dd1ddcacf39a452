package campaign

import (
	"os"
	"testing"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// shared is the redis-server the package's tests share, each test in a
// database of its own.
var shared *redistest.Shared

func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }
