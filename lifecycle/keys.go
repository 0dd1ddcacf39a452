package lifecycle

import "github.com/notify-throttle/throttler/internal/keyspace"

// The keys of the events, under the throttle's prefix (the engine's keys
// have '{' right after it, so none can meet these); what they hold:
// docs/operations.md#events-and-status-callbacks. A history lives in its
// message's slot, as the message's sent marker (keyspace.Done) does; a
// stream in its tenant's, the tenant encoded as a subject is.
//
//	history  <prefix>events:{<message>}    list of the events' JSON
//	stream   <prefix>callbacks:{<tenant>}  field "e": an event not yet POSTed

// Group is the consumer group of every stream: each worker's Dispatcher is
// a consumer of it.
const Group = "callbacks"

func historyKey(prefix, message string) string { return prefix + "events:{" + message + "}" }

func streamKey(prefix, tenant string) string {
	return prefix + "callbacks:{" + keyspace.EncodeSubject(tenant) + "}"
}
