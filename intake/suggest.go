package intake

import (
	"maps"
	"slices"
	"strings"

	"github.com/notify-throttle/throttler/internal/textdist"
)

// suggestion says which of the names defined the unknown name was likely
// meant to be, as -check words it for config keys: " (did you mean
// marketing?)", else the names defined, " (defined: a, b)"; "" when none
// are.
func suggestion[V any](name string, defined map[string]V) string {
	known := slices.Sorted(maps.Keys(defined))
	if len(known) == 0 {
		return ""
	}
	best, bestDist := "", -1
	for _, k := range known {
		if d := textdist.Distance(strings.ToLower(name), strings.ToLower(k)); bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist <= max(1, min(len(name), len(best))/3) {
		return " (did you mean " + best + "?)"
	}
	if len(known) > 10 {
		known = append(known[:10], "...")
	}
	return " (defined: " + strings.Join(known, ", ") + ")"
}
