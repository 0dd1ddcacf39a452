package campaign

import (
	"strconv"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// Every Redis key the package uses is built here. A tick's keys share the
// hash tag of asynq's keys of the campaign's queue, where its fan-out task
// runs; a seen set that of its shard, whose pending list and task hashes
// enqueue.lua writes with it. Campaign and queue names are config names
// ([A-Za-z0-9_.-]): they cannot break the tag.

// tickKeys are the keys of one tick's fan-out.
type tickKeys struct {
	progress string // hash: pos, line, read, enqueued, existing, invalid, started, finished, done, expired
	lease    string // string: the token of the run fanning it out, with a TTL
	running  string // sorted set of the queue: "<campaign>:<tick>" of unfinished fan-outs, by tick
	taskPfx  string // asynq's task hash prefix of the queue (its fan-out tasks)
}

func keysOf(prefix, queue string, t Tick) tickKeys {
	base := tickBase(prefix, queue, t)
	return tickKeys{progress: base, lease: base + ":lease", running: runningKey(prefix, queue), taskPfx: asynqdb.TaskKeyPrefix(queue)}
}

func tickBase(prefix, queue string, t Tick) string {
	return prefix + "campaign:{" + queue + "}:" + t.Campaign + ":" + strconv.FormatInt(t.Unix, 10)
}

// seenKey is the set of tick t's recipients enqueued in shard.
func seenKey(prefix, shard string, t Tick) string { return tickBase(prefix, shard, t) + ":seen" }

// runningKey is the sorted set of a queue's unfinished fan-outs.
func runningKey(prefix, queue string) string { return prefix + "campaign:{" + queue + "}:running" }

// firedKey is the sorted set of each campaign's last tick fired (or
// skipped), in Unix seconds: a worker that starts finds missed ticks there.
func firedKey(prefix string) string { return prefix + "campaign:fired" }
