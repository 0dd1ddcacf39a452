// Package asynqdb holds everything this module relies on of how asynq keeps
// its tasks in Redis. asynq keeps that layout internal (its internal/base
// and internal/rdb packages) and may change it in any release. This module
// writes it directly where an exported API cannot do the job:
// campaign/enqueue.lua (a campaign's batches, docs/design.md#campaigns),
// fleet/reap.lua (docs/design.md#dead-workers), fleet/rescale.lua
// (docs/booking.md#a-change-of-rate) and fleet/wake.lua
// (docs/booking.md#waking-up).
//
// The contract, as read from asynq Version's source (internal/rdb/rdb.go,
// processor.go) and checked against the asynq the module builds with by
// TestContract here (items 1-3 and the version) and by the fleet
// package's tests (items 4-5), so that an upgrade that changes any item
// fails the tests, not the workers:
//
//  1. Keys. Every key of queue q carries q as its cluster hash tag, so one
//     script can touch a whole queue on a cluster: the pending list
//     asynq:{q}:pending (Client.Enqueue LPUSHes, the dequeue RPOPLPUSHes
//     into active: the right end is the head), the active list
//     asynq:{q}:active, the lease sorted set asynq:{q}:lease (task ID
//     scored by its lease's expiry, Unix seconds: now+30 s at the dequeue,
//     extended every 5 s by the server's heartbeat) and the task hash
//     asynq:{q}:t:<id>. asynq:queues is the set of queue names.
//  2. The task hash. Field msg is the TaskMessage protobuf (Message),
//     state is "pending", "active", ..., and pending_since (Unix ns) is set
//     by the enqueue and removed by the dequeue.
//  3. Enqueue is: unless the task hash exists, HSET msg, state "pending"
//     and pending_since, then LPUSH the ID on pending (campaign/enqueue.lua).
//  4. Requeue is what a server does with a task it gives back at shutdown
//     (rdb.Requeue): LREM it from active, ZREM it from lease, RPUSH it on
//     pending (the head) and HSET state "pending" (fleet/reap.lua). The
//     task runs again with its retry count unchanged, and asynq's own
//     recoverer, which reads only the lease set, no longer sees it.
//  5. A server whose task was moved away still ends its handler and then
//     runs Done, Retry or Archive on the task: each starts with LREM from
//     active and, when the task is not there, answers "NOT FOUND" (logged)
//     and changes nothing. When another server runs the task again, Retry
//     moves it to the retry set, keeping it, where Done would delete it:
//     so a handler that learns its task was handed over returns an error.
//  6. A task its handler defers (returns an error asynq retries) waits in
//     the retry set asynq:{q}:retry, scored by the Unix second it is due;
//     the forwarder moves it to pending then, and a score rewritten while
//     it waits is the one it wakes at. The worker moves a waiting task's
//     wake-up that way (jobs.Repace); TestContractRetry.
//  7. A task in the retry set (state "retry") that is ZREMed from it, RPUSHed
//     on pending and given state "pending" and pending_since, as item 4 and
//     the forwarder do, is the next one dequeued and runs with its retry
//     count unchanged (fleet's waking; fleet's TestWakeAtTheMomentAtTheHead
//     runs it through an asynq server). A retry score the worker rewrites
//     to a fraction of a second is one the forwarder moves at the whole
//     second after it (TestContractRetry), so the worker may keep a
//     waiting task's moment there to the millisecond (fleet/wake.lua).
//  8. A handler is given its task's headers (the task message's field 15)
//     as the very map the server keeps with the task (processor.go sets
//     task.headers = msg.Headers, uncopied), and a retry writes the message
//     back with that map (rdb.Retry encodes a copy of the message sharing
//     it): an entry a handler sets before it returns an error asynq
//     retries is in the task's headers when it runs again. That is where a
//     task keeps that it is in its tenant's line (jobs). A task enqueued
//     without headers has none (a nil map) and can keep nothing there, so
//     the project's producers give every task one; TestContractRetry.
//
// Version is pinned in go.mod for this reason.
package asynqdb

// Version is the asynq release the contract above was read from and
// tested against.
const Version = "v0.26.0"

// AllQueues is asynq's set of known queue names (what its Inspector lists).
const AllQueues = "asynq:queues"

// QueuePrefix returns the prefix of every key of queue q: "asynq:{q}:".
func QueuePrefix(q string) string { return "asynq:{" + q + "}:" }

// PendingKey returns queue q's list of pending task IDs.
func PendingKey(q string) string { return QueuePrefix(q) + "pending" }

// ActiveKey returns queue q's list of active task IDs.
func ActiveKey(q string) string { return QueuePrefix(q) + "active" }

// LeaseKey returns queue q's sorted set of active task IDs by lease expiry.
func LeaseKey(q string) string { return QueuePrefix(q) + "lease" }

// RetryKey returns queue q's sorted set of deferred tasks, scored by the
// Unix second each is due.
func RetryKey(q string) string { return QueuePrefix(q) + "retry" }

// TaskKeyPrefix returns the prefix of queue q's task hashes.
func TaskKeyPrefix(q string) string { return QueuePrefix(q) + "t:" }

// TaskKey returns the hash of task id in queue q.
func TaskKey(q, id string) string { return TaskKeyPrefix(q) + id }

// Task states, as the task hash's state field holds them.
const (
	StatePending = "pending"
	StateActive  = "active"
)
