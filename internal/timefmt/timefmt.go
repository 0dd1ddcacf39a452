// Package timefmt writes and reads time as the project shows it to people
// and takes it from config: durations without their zero units, time zones
// by IANA name. It holds nothing of the engine, so that config and the
// commands need not import it to print a window.
package timefmt

import (
	"fmt"
	"strings"
	"time"
)

// Duration writes d for people: time.Duration.String without its zero units
// ("168h", "1h30m", "1m").
func Duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// LoadZone returns the IANA time zone name ("Europe/Paris", "UTC"), for
// calendar windows and quiet hours. "Local" (the host's zone, which differs
// from host to host) is not one. Its error describes only the value, as
// time.LoadLocation's does, for the caller to place after the setting's name.
func LoadZone(name string) (*time.Location, error) {
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" || name == "" {
		return nil, fmt.Errorf("unknown time zone %q (an IANA zone such as Europe/Paris)", name)
	}
	return loc, nil
}
