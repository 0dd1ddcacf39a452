// Package redisguard keeps a worker calm while Redis is unavailable
// (docs/design.md#the-worker, "Redis trouble"): a Guard is a go-redis hook
// that holds back a call Redis could not serve for a growing, capped delay
// before its error returns. Calls Redis answers, even with an error reply,
// pass untouched.
package redisguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options tune a Guard. The zero value means every default.
type Options struct {
	MinDelay time.Duration // the first failing call's; default 50ms
	MaxDelay time.Duration // the cap of the delay, doubled per failing call; default 2s
	LogEvery time.Duration // the least gap between outage log lines; default 10s
}

// Guard tracks whether Redis answers and delays failing calls while it does
// not, for any number of clients. Safe for concurrent use.
type Guard struct {
	log  *slog.Logger
	opts Options

	mu         sync.Mutex
	down       bool      // the last call found Redis unavailable
	since      time.Time // when the outage began
	fails      int       // failing calls in a row, which set the delay
	total      int       // failing calls in this outage
	suppressed int       // errors not yet reported in a log line
	silenced   int       // asynq and go-redis log lines not written (see logs.go)
	lastLog    time.Time // when the last outage line was written
	reported   bool      // this outage has been logged, so its end will be
}

// New returns a Guard that logs to log (slog.Default if nil).
func New(log *slog.Logger, opts Options) *Guard {
	if log == nil {
		log = slog.Default()
	}
	if opts.MinDelay <= 0 {
		opts.MinDelay = 50 * time.Millisecond
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = 2 * time.Second
	}
	opts.MaxDelay = max(opts.MaxDelay, opts.MinDelay)
	if opts.LogEvery <= 0 {
		opts.LogEvery = 10 * time.Second
	}
	return &Guard{log: log, opts: opts}
}

// Install adds g as a hook to rdb and returns rdb.
func (g *Guard) Install(rdb redis.UniversalClient) redis.UniversalClient {
	rdb.AddHook(Observer(g.observe))
	return rdb
}

// Connect calls connect (redisconn.Serve) until it returns a client, with
// the Guard's delays while Redis is unreachable, and installs g on the
// client: a worker started before its Redis waits for it. Any other error
// returns at once, as does the last one when ctx ends.
func (g *Guard) Connect(ctx context.Context, connect func(context.Context) (redis.UniversalClient, func() error, error)) (redis.UniversalClient, func() error, error) {
	for {
		rdb, closeFn, err := connect(ctx)
		if err == nil {
			g.answered()
			return g.Install(rdb), closeFn, nil
		}
		if ctx.Err() == nil && !Unreachable(err) {
			return nil, nil, err
		}
		if ctx.Err() == nil {
			sleep(ctx, g.failed(err))
		}
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("redisguard: gave up waiting for redis: %w", err)
		}
	}
}

// Observer is a go-redis hook that hands the outcome of every command or
// pipeline to the function. Dials pass through: the call that needed the
// connection is judged, after go-redis's retries.
type Observer func(ctx context.Context, err error)

// DialHook passes dials through.
func (f Observer) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook hands f a command's outcome.
func (f Observer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f(ctx, err)
		return err
	}
}

// ProcessPipelineHook hands f a pipeline's (or transaction's) outcome.
func (f Observer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		f(ctx, err)
		return err
	}
}

// observe records the outcome of one call and, if Redis was unavailable,
// sleeps for the current delay (or until ctx ends). Other errors (a
// cancelled context, a closed client) neither start nor end an outage.
func (g *Guard) observe(ctx context.Context, err error) {
	switch {
	case Unavailable(err):
		sleep(ctx, g.failed(err))
	case err == nil || isReply(err):
		g.answered()
	}
}

// failed records a call Redis did not serve, logs if a line is due, and
// returns how long to hold the call back.
func (g *Guard) failed(err error) time.Duration {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.down {
		g.down, g.since, g.fails, g.total, g.reported = true, now, 0, 0, false
	}
	g.fails++
	g.total++
	g.suppressed++
	if now.Sub(g.lastLog) >= g.opts.LogEvery {
		if g.reported {
			g.log.Warn("redis still unavailable; failing calls are delayed",
				"for", now.Sub(g.since).Round(time.Second), "errors", g.suppressed,
				"log_lines_silenced", g.silenced, "last_err", err.Error())
		} else {
			g.log.Warn("redis unavailable; failing calls are delayed until it answers",
				"err", err.Error(), "max_delay", g.opts.MaxDelay)
		}
		g.lastLog, g.reported, g.suppressed, g.silenced = now, true, 0, 0
	}
	return g.delay()
}

// delay is MinDelay doubled per failing call in a row, capped at MaxDelay,
// with the upper half jittered so that many callers do not wake together.
func (g *Guard) delay() time.Duration {
	d := g.opts.MaxDelay
	if shift := g.fails - 1; shift < 30 {
		d = min(d, g.opts.MinDelay<<shift)
	}
	return d/2 + rand.N(d/2+1)
}

// answered records a call that reached Redis, ending an outage.
func (g *Guard) answered() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.down {
		return
	}
	if g.reported {
		g.log.Info("redis available again",
			"after", time.Since(g.since).Round(time.Millisecond), "errors", g.total)
	}
	g.down, g.fails, g.total, g.suppressed, g.silenced = false, 0, 0, 0, 0
}

// Unavailable reports whether err means Redis could not serve the call, so
// that retrying at once is pointless: it was unreachable, or refuses every
// call (or write) until an operator steps in (refusedReplies).
func Unavailable(err error) bool {
	return Unreachable(err) || hasReplyPrefix(err, refusedReplies)
}

// Unreachable reports whether err means Redis could not be reached or is
// not serving yet: a network error, a connection closed under the call, a
// pool timeout, or one of notServingReplies. A refused listen, a cancelled
// context and a closed client are not.
func Unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) {
		// Checked first: a dial that timed out wraps the context's error.
		return op.Op != "listen"
	}
	if err == nil || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || hasReplyPrefix(err, notServingReplies) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, redis.ErrPoolTimeout)
}

// Replies by which Redis serves no call for a while, which passes.
var notServingReplies = []string{
	"LOADING ", "BUSY ", "MASTERDOWN ", "CLUSTERDOWN ", "NOREPLICAS ", "ERR max number of clients",
}

// Replies by which Redis refuses calls until someone fixes something.
var refusedReplies = []string{
	"OOM ", "MISCONF ", "READONLY ", "NOAUTH ", "WRONGPASS ", "NOPERM ",
}

func hasReplyPrefix(err error, prefixes []string) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(msg, p) })
}

// isReply reports whether err is an answer from Redis (redis.Nil, an error
// reply): the server is there.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !Unavailable(err)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
