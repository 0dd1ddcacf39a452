package campaign

import (
	"strconv"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// Every Redis key the package uses is built here.
//
// The keys of one tick's fan-out share the hash tag of asynq's keys for the
// campaign's queue, {<queue>}, where its fan-out task runs; the seen set
// of each shard of the queue (jobs.AsynqQueue) that of the shard, because
// enqueue.lua writes it together with the shard's pending list and task
// hashes: on a Redis Cluster they must live in that shard's slot. Campaign
// and queue names are config names ([A-Za-z0-9_.-]), so they cannot break
// the tag.

// tickKeys are the keys of one tick's fan-out.
type tickKeys struct {
	progress string // hash: pos, line, read, enqueued, existing, invalid, started, finished, done, expired
	lease    string // string: the token of the fan-out running it, with a TTL
	running  string // sorted set of the queue: "<campaign>:<tick>" of unfinished fan-outs, by tick
	taskPfx  string // asynq's task hash prefix of the queue (its fan-out tasks)
}

func keysOf(prefix, queue string, t Tick) tickKeys {
	base := tickBase(prefix, queue, t)
	return tickKeys{
		progress: base,
		lease:    base + ":lease",
		running:  runningKey(prefix, queue),
		taskPfx:  asynqdb.TaskKeyPrefix(queue),
	}
}

func tickBase(prefix, queue string, t Tick) string {
	return prefix + "campaign:{" + queue + "}:" + t.Campaign + ":" + strconv.FormatInt(t.Unix, 10)
}

// seenKey is the set of the recipients of tick t enqueued in shard, while
// its fan-out runs.
func seenKey(prefix, shard string, t Tick) string { return tickBase(prefix, shard, t) + ":seen" }

// runningKey is the sorted set of a queue's unfinished fan-outs, which
// every worker watches to take over one whose worker died.
func runningKey(prefix, queue string) string {
	return prefix + "campaign:{" + queue + "}:running"
}

// firedKey is the sorted set of the last tick fired (or deliberately
// skipped) per campaign: member the campaign, score the tick in Unix
// seconds. A worker that starts compares it with the schedule to find
// missed ticks.
func firedKey(prefix string) string { return prefix + "campaign:fired" }
