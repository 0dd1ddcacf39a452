package throttle

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// entry is one entry point of the Lua library: a function for FCALL, and the
// same code as a script for servers without functions. Each name is held as
// an any, ready to be a command argument.
type entry struct {
	fn  any // function name
	sha any // the script's SHA-1
	src any // the script
}

func newEntry(fn, src string) entry { return entry{fn, redis.NewScript(src).Hash(), src} }

// eval runs entry point e for each call, in one round trip (a pipeline) when
// there are several, and returns each call's reply (nil for a call that
// failed) and the first error. It calls the library's function, loading the
// library where a node lacks it and resending only the failed calls, or
// runs the same code as a script where the server has no functions:
// docs/design.md, "How the Lua runs".
func (l *Limiter) eval(ctx context.Context, e entry, calls []call) ([][]int64, error) {
	vals := make([][]int64, len(calls))
	errs := make([]error, len(calls))
	todo := make([]int, len(calls))
	for i := range todo {
		todo[i] = i
	}
	if !l.noFunctions.Load() {
		l.send(ctx, calls, todo, vals, errs, "fcall", e.fn)
		if again := failing(todo, errs, functionMissing); len(again) > 0 {
			loadErr := l.loadFunctions(ctx)
			if loadErr != nil && noFunctions(loadErr) {
				// Functions are not allowed here after all: scripts, below.
				for _, i := range again {
					errs[i] = loadErr
				}
			} else {
				// Sent again even if a node could not take the library (a
				// cluster master that is down): theirs may have.
				l.send(ctx, calls, again, vals, errs, "fcall", e.fn)
				if loadErr != nil {
					for _, i := range failing(again, errs, functionMissing) {
						errs[i] = loadErr
					}
				}
			}
		}
		todo = failing(todo, errs, noFunctions)
		if len(todo) > 0 {
			l.noFunctions.Store(true)
		}
	}
	if len(todo) > 0 {
		l.send(ctx, calls, todo, vals, errs, "evalsha", e.sha)
		if again := failing(todo, errs, func(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }); len(again) > 0 {
			l.send(ctx, calls, again, vals, errs, "eval", e.src)
		}
	}
	return vals, cmp.Or(errs...)
}

// eval1 is eval for one call, with the commands beside, if any, in the same
// round trip (a pipeline: on a cluster, to each command's node at once). The
// common case (the library is loaded) takes nothing but the commands and
// their replies.
func (l *Limiter) eval1(ctx context.Context, e entry, c call, beside ...redis.Cmder) ([]int64, error) {
	var fc *redis.IntSliceCmd
	cmds := beside
	if !l.noFunctions.Load() {
		c[0], c[1] = "fcall", e.fn
		fc = redis.NewIntSliceCmd(ctx, c...)
		cmds = append([]redis.Cmder{fc}, beside...)
	}
	switch {
	case len(beside) > 0:
		_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				_ = p.Process(ctx, cmd)
			}
			return nil
		})
	case fc != nil:
		_ = l.one.Process(ctx, fc)
	}
	if fc != nil {
		if v, err := fc.Result(); err == nil || !functionMissing(err) && !noFunctions(err) {
			return v, err
		}
	}
	// The library must be loaded, or scripts used: eval knows how. The
	// FCALL above failed, so nothing ran.
	res, err := l.eval(ctx, e, []call{c})
	return res[0], err
}

// send runs calls[idx] as command name on target (function, SHA-1 or
// source), in one round trip, and records each one's reply and error.
func (l *Limiter) send(ctx context.Context, calls []call, idx []int, vals [][]int64, errs []error, name string, target any) {
	for _, i := range idx {
		calls[i][0], calls[i][1] = name, target
	}
	if len(idx) == 1 {
		i := idx[0]
		c := redis.NewIntSliceCmd(ctx, calls[i]...)
		_ = l.one.Process(ctx, c)
		vals[i], errs[i] = c.Result()
		return
	}
	cmds := make([]*redis.IntSliceCmd, len(idx))
	_, _ = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range idx {
			cmds[k] = redis.NewIntSliceCmd(ctx, calls[i]...)
			_ = p.Process(ctx, cmds[k])
		}
		return nil
	})
	for k, i := range idx {
		vals[i], errs[i] = cmds[k].Result()
	}
}

// failing returns the indices in idx whose error matches.
func failing(idx []int, errs []error, match func(error) bool) []int {
	var out []int
	for _, i := range idx {
		if errs[i] != nil && match(errs[i]) {
			out = append(out, i)
		}
	}
	return out
}

// functionMissing reports a node without the library's functions.
func functionMissing(err error) bool { return redis.HasErrorPrefix(err, "Function not found") }

// noFunctions reports a server that cannot run functions: FCALL or FUNCTION
// unknown, or not permitted to this user.
func noFunctions(err error) bool {
	if redis.HasErrorPrefix(err, "unknown command") {
		return true
	}
	if redis.HasErrorPrefix(err, "NOPERM") {
		msg := strings.ToLower(err.Error())
		return strings.Contains(msg, "'fcall'") || strings.Contains(msg, "'function")
	}
	return false
}

// loadFunctions loads the library on the server, or on every master of a
// cluster (or every shard of a ring). A library of that name is this very
// code (the name carries its hash), so "already exists" is success.
func (l *Limiter) loadFunctions(ctx context.Context) error {
	l.loading.Lock()
	defer l.loading.Unlock()
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, l.lib.Source).Err()
		if err != nil && redis.HasErrorPrefix(err, "Library '"+l.lib.Name+"' already exists") {
			return nil
		}
		return err
	}
	loadOn := func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }
	var err error
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, loadOn)
	case *redis.Ring:
		err = c.ForEachShard(ctx, loadOn)
	default:
		err = load(ctx, l.rdb)
	}
	if err != nil && !noFunctions(err) {
		err = fmt.Errorf("load the Lua library: %w", err)
	}
	return err
}
