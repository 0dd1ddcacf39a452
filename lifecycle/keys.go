package lifecycle

import "github.com/notify-throttle/throttler/internal/keyspace"

// The keys of the events (docs/operations.md#events-and-status-callbacks),
// under the throttle's prefix, which no engine key meets (its '{' follows
// the prefix): a history in its message's slot, as its sent marker is; a
// stream in its tenant's, the tenant encoded as a subject is.

// Group is the consumer group of every stream: each worker's Dispatcher is
// a consumer of it.
const Group = "callbacks"

func historyKey(prefix, message string) string { return prefix + "events:{" + message + "}" }

func streamKey(prefix, tenant string) string {
	return prefix + "callbacks:{" + keyspace.EncodeSubject(tenant) + "}"
}
