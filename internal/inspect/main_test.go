package inspect

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// shared is the package's redis-server: each test has a database of its
// own on it.
var shared *redistest.Shared

func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }

// standalone returns a client on a fresh database of the shared server.
func standalone(t *testing.T) redis.UniversalClient {
	t.Helper()
	c, _ := shared.NewClient(t)
	return c
}
