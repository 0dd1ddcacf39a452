package intake

import (
	"maps"
	"slices"

	"github.com/notify-throttle/throttler/config"
)

// suggestion says which of the names defined the unknown name was likely
// meant to be, as -check words it for config keys: " (did you mean
// marketing?)", else the names defined, " (defined: a, b)"; "" when none
// are.
func suggestion[V any](name string, defined map[string]V) string {
	known := slices.Sorted(maps.Keys(defined))
	if best, ok := config.Closest(name, known); ok {
		return " (did you mean " + best + "?)"
	} else if len(known) == 0 {
		return ""
	}
	return " (defined: " + config.Listed(known) + ")"
}
