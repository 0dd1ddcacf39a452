package redisguard

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// AsynqLogger is an asynq.Logger that writes to a slog.Logger. While its
// Guard sees Redis down, asynq's warnings and errors are only counted, for
// the Guard's next outage line: every asynq component reports a dead Redis
// on its own timer, which would otherwise be the bulk of the log.
type AsynqLogger struct {
	g   *Guard
	log *slog.Logger
}

// AsynqLogger returns the asynq logger of g, writing to g's logger.
func (g *Guard) AsynqLogger() *AsynqLogger {
	return &AsynqLogger{g: g, log: g.log.With("component", "asynq")}
}

// asynq.Logger's methods: Warn and Error log unless Redis is down; Fatal
// exits, as asynq expects.

func (l *AsynqLogger) Debug(args ...any) { l.log.Debug(fmt.Sprint(args...)) }
func (l *AsynqLogger) Info(args ...any)  { l.log.Info(fmt.Sprint(args...)) }

func (l *AsynqLogger) Warn(args ...any) {
	if !l.g.quiet() {
		l.log.Warn(fmt.Sprint(args...))
	}
}

func (l *AsynqLogger) Error(args ...any) {
	if !l.g.quiet() {
		l.log.Error(fmt.Sprint(args...))
	}
}

func (l *AsynqLogger) Fatal(args ...any) {
	l.log.Error(fmt.Sprint(args...))
	os.Exit(1)
}

// quiet reports whether Redis is down, counting the line it silences.
func (g *Guard) quiet() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		g.silenced++
	}
	return g.down
}

// RedisLogger is go-redis's logger (redis.SetLogger) writing to a
// slog.Logger, counted like asynq's while Redis is down. It has a limit of
// its own, a line per LogEvery: go-redis logs failed dials from inside the
// call, before the Guard has seen it fail.
type RedisLogger struct {
	g    *Guard
	log  *slog.Logger
	mu   sync.Mutex
	last time.Time
}

// RedisLogger returns the go-redis logger of g, writing to g's logger.
func (g *Guard) RedisLogger() *RedisLogger {
	return &RedisLogger{g: g, log: g.log.With("component", "go-redis")}
}

// Printf logs at warn level unless Redis is down or a line went out less
// than LogEvery ago.
func (l *RedisLogger) Printf(_ context.Context, format string, v ...any) {
	if l.g.quiet() || !l.due() {
		return
	}
	l.log.Warn(fmt.Sprintf(format, v...))
}

// due reports whether a line may go out now, counting it if not.
func (l *RedisLogger) due() bool {
	l.mu.Lock()
	now := time.Now()
	ok := now.Sub(l.last) >= l.g.opts.LogEvery
	if ok {
		l.last = now
	}
	l.mu.Unlock()
	if !ok {
		l.g.mu.Lock()
		l.g.silenced++
		l.g.mu.Unlock()
	}
	return ok
}
