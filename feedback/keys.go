package feedback

// A report's mark: "applying" while a request applies it (claimTTL), then
// "applied" for Options.Remember (docs/operations.md, "Once each").
const (
	applying = "applying"
	applied  = "applied"
)

// markKey is the mark of the report of Report.id id, under the throttle's
// prefix, which no engine key meets (its '{' follows the prefix).
func markKey(prefix, id string) string { return prefix + "feedback:{" + id + "}" }
