package fleet

// Every key of the package is built here. A queue's keys carry the queue's
// name as their hash tag, as asynq's do, so that reap.lua sees a queue's
// held sets, beats and asynq's task lists in one slot of a cluster.

// heldPrefix starts the name of each worker's set of the tasks it holds in
// queue q; the worker's ID ends it.
func heldPrefix(prefix, q string) string { return prefix + "recovery:{" + q + "}:held:" }

// heldKey is worker's set of the tasks it holds in queue q (hold.lua).
func heldKey(prefix, q, worker string) string { return heldPrefix(prefix, q) + worker }

// beatsKey is queue q's sorted set of workers by their last sign of life.
func beatsKey(prefix, q string) string { return prefix + "recovery:{" + q + "}:beats" }
