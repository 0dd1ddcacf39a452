package config

import (
	"cmp"
	"errors"
	"math"
	"regexp"
	"time"
)

// durationSyntax is what a "not a duration" message shows as examples.
const durationSyntax = "such as 500ms, 90s, 1h30m or 7d"

var errDuration = errors.New("not a duration")

// dayPrefix splits a duration starting with days: sign, days, the unsigned rest.
var dayPrefix = regexp.MustCompile(`^([-+]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)d([^-+].*)?$`)

// parseDuration parses a Go duration ("500ms", "1h30m") that may start with
// a number of days: "7d", "1d12h", "1.5d", "-2d". A day is 24h.
func parseDuration(s string) (time.Duration, error) {
	m := dayPrefix.FindStringSubmatch(s)
	if m == nil {
		return time.ParseDuration(s) // no Go unit has a d
	}
	// n days are n*24 hours: parse n as hours, exactly, then scale.
	days, err := time.ParseDuration(m[2] + "h")
	rest, errRest := time.ParseDuration(cmp.Or(m[3], "0s"))
	if err != nil || errRest != nil || days > (math.MaxInt64-rest)/24 {
		return 0, errDuration
	}
	if m[1] == "-" {
		return -(days*24 + rest), nil
	}
	return days*24 + rest, nil
}
