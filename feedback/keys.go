package feedback

// The feedback's one key, under the throttle's prefix (the engine's keys
// have '{' right after it, so none can meet this one):
//
//	mark  <prefix>feedback:{<report>}  "applying" while a request applies the
//	                                   report (claimTTL), then "applied" for
//	                                   Options.Remember
//
// <report> is Report.id, hex.

const (
	applying = "applying"
	applied  = "applied"
)

func markKey(prefix, id string) string { return prefix + "feedback:{" + id + "}" }
