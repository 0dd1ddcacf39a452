package campaign

import (
	"strconv"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// Every Redis key the package uses is built here.
//
// The keys of one tick's fan-out share the hash tag of asynq's keys for the
// campaign's queue, {<queue>}, because one script writes them together with
// asynq's pending list and task hashes: on a Redis Cluster they must live in
// that queue's slot. Campaign and queue names are config names
// ([A-Za-z0-9_.-]), so they cannot break the tag.

// tickKeys are the keys of one tick's fan-out.
type tickKeys struct {
	progress string // hash: pos, line, read, enqueued, existing, invalid, started, finished, done, expired
	lease    string // string: the token of the fan-out running it, with a TTL
	seen     string // set: recipients handled so far, while it runs
	running  string // sorted set of the queue: "<campaign>:<tick>" of unfinished fan-outs, by tick
	pending  string // asynq's pending list of the queue
	taskPfx  string // asynq's task hash prefix of the queue
}

func keysOf(prefix, queue string, t Tick) tickKeys {
	tag := prefix + "campaign:{" + queue + "}:"
	base := tag + t.Campaign + ":" + strconv.FormatInt(t.Unix, 10)
	return tickKeys{
		progress: base,
		lease:    base + ":lease",
		seen:     base + ":seen",
		running:  runningKey(prefix, queue),
		pending:  asynqdb.PendingKey(queue),
		taskPfx:  asynqdb.TaskKeyPrefix(queue),
	}
}

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
