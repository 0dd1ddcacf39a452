package asynqdb

import (
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Shards: each queue of the config is served from n asynq queues, how and
// why in docs/design.md#redis-cluster ("Shards: a queue over the masters").

// ShardSep separates a queue's name from its shard's number: config names
// cannot hold it.
const ShardSep = "~"

// slots is the number of a Redis Cluster's hash slots.
const slots = 16384

// Shard returns the name of the asynq queue of shard i of n of queue.
func Shard(queue string, i, n int) string {
	if i == 0 || n <= 1 {
		return queue
	}
	// The first name queue~i or queue~i.k whose slot falls in the i-th
	// n-th of the slot space after the queue's own.
	part := func(q string) int { return min(int(slot(q))*n/slots, n-1) }
	want := (part(queue) + i) % n
	name := queue + ShardSep + strconv.Itoa(i)
	for k := 0; ; k++ {
		try := name
		if k > 0 {
			try = name + "." + strconv.Itoa(k)
		}
		if part(try) == want {
			return try
		}
	}
}

// ShardOf is the asynq queue that holds task id put in queue (a name of
// the config's worker.queues) when each queue has shards shards: the one
// place where a task's asynq queue is chosen.
func ShardOf(queue, id string, shards int) string {
	if shards <= 1 {
		return queue
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	return Shard(queue, int(h.Sum32()%uint32(shards)), shards)
}

// BaseQueue is the config's queue that asynq queue q is a shard of.
func BaseQueue(q string) string {
	base, _, _ := strings.Cut(q, ShardSep)
	return base
}

// Served returns the asynq queues a worker serves, with their priorities:
// the shards of each of weights' queues, each with its queue's weight,
// and those of known (asynq's list of queues) that are shards of them left
// from another number of shards.
func Served(weights map[string]int, shards int, known []string) map[string]int {
	served := make(map[string]int, len(weights)*max(shards, 1))
	for q, w := range weights {
		for i := range max(shards, 1) {
			served[Shard(q, i, shards)] = w
		}
	}
	for _, q := range known {
		if w, ok := weights[BaseQueue(q)]; ok && q != BaseQueue(q) {
			served[q] = w
		}
	}
	return served
}

// Names returns the names of served, sorted, for what watches every queue
// served (fleet, the API's lookups).
func Names(served map[string]int) []string {
	return slices.Sorted(maps.Keys(served))
}

// slot is the Redis Cluster hash slot of a key whose hash tag is tag:
// CRC16 (XMODEM) mod 16384.
func slot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % slots
}
