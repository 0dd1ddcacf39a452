package redistest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// sharedDatabases is how many databases a shared server has: more than
// any package has tests.
const sharedDatabases = 4096

// Shared is the one redis-server all of a package's tests use, each in a
// database of its own; a test that stops, kills or reconfigures a server
// starts its own.
type Shared struct {
	*Server

	mu     sync.Mutex
	nextDB int
}

// RunShared starts a shared server, points *s at it, runs the package's
// tests and stops the server. Call it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(redistest.RunShared(m, &shared)) }
func RunShared(m *testing.M, s **Shared) int {
	env := &mainTB{}
	defer env.cleanup()
	*s = &Shared{Server: Start(env, "databases "+strconv.Itoa(sharedDatabases)), nextDB: 1}
	return m.Run()
}

// DB returns a database no other test of the package has had; 0 is left to
// code without a *testing.T, such as examples.
func (s *Shared) DB(t TB) int {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nextDB >= sharedDatabases {
		t.Fatalf("redistest: all %d databases of the shared server are taken", sharedDatabases)
	}
	n := s.nextDB
	s.nextDB++
	return n
}

// NewClient returns a client on a fresh database, and its number.
func (s *Shared) NewClient(t TB) (*redis.Client, int) {
	t.Helper()
	db := s.DB(t)
	c := s.ClientOn(t, db)
	if err := c.FlushDB(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: FLUSHDB %d: %v", db, err)
	}
	return c, db
}

// mainTB is the TB TestMain offers.
type mainTB struct {
	cleanups []func()
	dirs     []string
}

func (*mainTB) Helper() {}

func (e *mainTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	e.cleanup()
	os.Exit(1)
}

func (e *mainTB) Cleanup(f func()) { e.cleanups = append(e.cleanups, f) }

func (e *mainTB) TempDir() string {
	d, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		e.Fatalf("TempDir: %v", err)
	}
	e.dirs = append(e.dirs, d)
	return d
}

func (e *mainTB) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
	for _, d := range e.dirs {
		os.RemoveAll(d)
	}
}
