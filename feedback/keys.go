package feedback

// The keys of the feedback, under the throttle's prefix and built here. The
// part in braces is the Redis Cluster hash tag: a mark lives in a slot of
// its own report's. The engine's keys have '{' right after the prefix, so
// none can meet these.
//
//	mark  <prefix>feedback:{<report>}  string: "applying" while a request
//	                                   applies the report (claimTTL), then
//	                                   "applied" for Options.Remember
//
// <report> is the report's ID (Report.id): the ID of the event it records,
// or of the address's provider and the vendor's own ID for a report of an
// address alone; hex, so it needs no escaping.

// Values of a mark.
const (
	applying = "applying"
	applied  = "applied"
)

// markKey is the mark of report id.
func markKey(prefix, id string) string { return prefix + "feedback:{" + id + "}" }
