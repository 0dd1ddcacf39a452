package feedback

import (
	"os"
	"testing"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// shared is the package's redis-server: each test has a database of its
// own on it.
var shared *redistest.Shared

func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }
