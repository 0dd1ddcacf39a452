package lifecycle

import "github.com/notify-throttle/throttler/internal/keyspace"

// The keys of the events, under the throttle's prefix and built here. The
// part in braces is the Redis Cluster hash tag: a history lives in its
// message's slot, as the message's sent marker does
// (keyspace.Done); a stream in its tenant's. The engine's keys have '{'
// right after the prefix, so none can meet these.
//
//	history  <prefix>events:{<message>}     list: the message's events as JSON,
//	                                        its accepted event first
//	                                        (history.lua); expires
//	                                        Options.History after the last
//	stream   <prefix>callbacks:{<tenant>}   stream: the events of a tenant with a
//	                                        callback not yet POSTed, field "e"
//	                                        the event's JSON; consumer group
//	                                        Group; trimmed past Options.GiveUp
//
// A tenant is encoded as a throttle subject is (keyspace.EncodeSubject).

// Group is the consumer group of every stream: each worker's Dispatcher
// is a consumer of it.
const Group = "callbacks"

// historyKey is message's history.
func historyKey(prefix, message string) string { return prefix + "events:{" + message + "}" }

// streamKey is tenant's stream of events to POST.
func streamKey(prefix, tenant string) string {
	return prefix + "callbacks:{" + keyspace.EncodeSubject(tenant) + "}"
}
