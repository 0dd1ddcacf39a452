package recovery

// Every key of the package is built here. A queue's keys carry the queue's
// name as their hash tag, as asynq's do, so that reap.lua sees a queue's
// holders, beats and asynq's task lists in one slot of a cluster.

// holdersKey is queue q's hash of held tasks: task ID -> worker ID.
func holdersKey(prefix, q string) string { return prefix + "recovery:{" + q + "}:holders" }

// beatsKey is queue q's sorted set of workers by their last sign of life.
func beatsKey(prefix, q string) string { return prefix + "recovery:{" + q + "}:beats" }
