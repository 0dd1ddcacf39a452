package config

import (
	"errors"
	"math"
	"regexp"
	"strings"
	"time"
)

// durationSyntax is what a "not a duration" message shows as examples.
const durationSyntax = "such as 500ms, 90s, 1h30m or 7d"

var errDuration = errors.New("not a duration")

// dayPrefix splits a duration starting with days: sign, days, the rest.
var dayPrefix = regexp.MustCompile(`^([-+]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)d(.*)$`)

// parseDuration parses a Go duration ("500ms", "1h30m") that may start with
// a number of days: "7d", "1d12h", "1.5d", "-2d". A day is 24h.
func parseDuration(s string) (time.Duration, error) {
	m := dayPrefix.FindStringSubmatch(s)
	if m == nil {
		return time.ParseDuration(s) // no Go unit has a d
	}
	// n days are n*24 hours: parse n as hours, exactly, then scale.
	d, err := time.ParseDuration(m[2] + "h")
	if err != nil || d > math.MaxInt64/24 || strings.HasPrefix(m[3], "-") || strings.HasPrefix(m[3], "+") {
		return 0, errDuration
	}
	d *= 24
	if m[3] != "" {
		r, err := time.ParseDuration(m[3])
		if err != nil || d > math.MaxInt64-r {
			return 0, errDuration
		}
		d += r
	}
	if m[1] == "-" {
		d = -d
	}
	return d, nil
}
