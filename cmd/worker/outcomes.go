package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/jobs"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/providers"
)

// outcomes is the asynq server's ErrorHandler and the filter on asynq's
// own log lines, so that each task outcome is one line (docs/operations.md#logs):
// handleError logs those the throttle does not (jobs.Logged) and notes each
// task asynq archives, whose "Retry exhausted" line, logged right after
// (asynq v0.26.0's processor.handleFailedMessage), the filter drops.
type outcomes struct {
	log       *slog.Logger
	mu        sync.Mutex
	archiving map[string]bool // tasks whose "Retry exhausted" line is to drop, until it comes
}

// maxArchiving bounds archiving, should asynq ever stop writing the line
// each entry waits for.
const maxArchiving = 10000

// exhausted is asynq's line for a task it archives.
const exhausted = "Retry exhausted for task id="

func newOutcomes(log *slog.Logger) *outcomes {
	return &outcomes{log: log, archiving: map[string]bool{}}
}

// handleError is asynq's ErrorHandler.
func (o *outcomes) handleError(ctx context.Context, t *asynq.Task, err error) {
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	// asynq's own test for archiving (handleFailedMessage).
	archive := errors.Is(err, asynq.SkipRetry) || retried >= maxRetry
	if archive {
		o.expect(id)
	}
	var d *jobs.Deferral
	switch {
	case archive && !errors.Is(err, asynq.SkipRetry):
		o.log.Warn(string(lifecycle.Archived), "task", id, "type", t.Type(), "reason", fmt.Sprintf("failed %d times", retried+1), "err", err)
	case jobs.Logged(err):
	case errors.As(err, &d):
		o.log.Info(string(lifecycle.Deferred), "task", id, "reason", d.Error())
	case archive:
		o.log.Warn(string(lifecycle.Archived), "task", id, "type", t.Type(), "err", err)
	default:
		if n, ok := providers.RetryBudget(err); ok {
			maxRetry = n // the provider's max_retries archives it first
		}
		o.log.Warn("job failed", "task", id, "type", t.Type(), "retry", retried+1, "of", maxRetry, "err", err)
	}
}

// expect notes that asynq is about to archive task id.
func (o *outcomes) expect(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.archiving) >= maxArchiving {
		clear(o.archiving)
	}
	o.archiving[id] = true
}

// drop reports whether asynq's line msg is the "Retry exhausted" of a task
// handleError expected, forgetting the task.
func (o *outcomes) drop(msg string) bool {
	id, ok := strings.CutPrefix(msg, exhausted)
	if !ok {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.archiving[id] {
		return false
	}
	delete(o.archiving, id)
	return true
}

// filteredLogger is an asynq logger without the "Retry exhausted" lines
// of the tasks o expected.
type filteredLogger struct {
	asynq.Logger
	o *outcomes
}

// Warn passes args on unless they are a line the outcomes drop.
func (f *filteredLogger) Warn(args ...any) {
	if f.o.drop(fmt.Sprint(args...)) {
		return
	}
	f.Logger.Warn(args...)
}

// newLogger returns the worker's logger as the config's log section says:
// text or JSON lines on w, from its level up.
func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // debug, info, warn or error: the config checked it
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == config.LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
