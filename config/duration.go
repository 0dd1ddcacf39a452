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

// days matches the number before a "d": 7, 1.5, .5
var days = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?|\.[0-9]+)$`)

// parseDuration parses a Go duration ("500ms", "1h30m") that may start with
// a number of days: "7d", "1d12h", "1.5d", "-2d". A day is 24h.
func parseDuration(s string) (time.Duration, error) {
	body, neg := s, false
	if body != "" && (body[0] == '-' || body[0] == '+') {
		body, neg = body[1:], body[0] == '-'
	}
	i := strings.IndexByte(body, 'd') // no Go unit has a d
	if i < 0 {
		return time.ParseDuration(s)
	}
	n, rest := body[:i], body[i+1:]
	if !days.MatchString(n) || strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
		return 0, errDuration
	}
	// n days are n*24 hours: parse n as hours, exactly, then scale.
	d, err := time.ParseDuration(n + "h")
	if err != nil || d > math.MaxInt64/24 {
		return 0, errDuration
	}
	d *= 24
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil || d > math.MaxInt64-r {
			return 0, errDuration
		}
		d += r
	}
	if neg {
		d = -d
	}
	return d, nil
}
