package throttle

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
)

// exampleRedis is the server the examples (which get no *testing.T) run
// against: started by TestMain, like the examples of a database driver.
var exampleRedis string

func TestMain(m *testing.M) {
	env := &mainTB{}
	srv := redistest.Start(env)
	exampleRedis = srv.Addr
	code := m.Run()
	env.cleanup()
	os.Exit(code)
}

// exampleClient returns a client on the examples' server, flushed.
func exampleClient() *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	rdb.FlushAll(context.Background())
	return rdb
}

// mainTB is the little of testing.TB that TestMain can offer redistest.
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

func (*mainTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func (e *mainTB) Cleanup(f func()) { e.cleanups = append(e.cleanups, f) }

func (e *mainTB) TempDir() string {
	d, err := os.MkdirTemp("", "throttle-test-")
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
