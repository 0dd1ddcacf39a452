package timefmt

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{168 * time.Hour, "168h"},
		{90 * time.Minute, "1h30m"},
		{time.Minute, "1m"},
		{90 * time.Second, "1m30s"},
		{time.Hour + time.Second, "1h0m1s"},
		{1500 * time.Millisecond, "1.5s"},
		{time.Millisecond, "1ms"},
		{0, "0s"},
		{-time.Hour, "-1h"},
	} {
		if got := Duration(tc.d); got != tc.want {
			t.Errorf("Duration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestLoadZone(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"Europe/Paris", true},
		{"UTC", true},
		{"Local", false},
		{"", false},
		{"Mars/Olympus", false},
	} {
		loc, err := LoadZone(tc.name)
		switch {
		case tc.ok && (err != nil || loc.String() != tc.name):
			t.Errorf("LoadZone(%q) = %v, %v; want the zone", tc.name, loc, err)
		case !tc.ok && err == nil:
			t.Errorf("LoadZone(%q) = %v; want an error", tc.name, loc)
		}
	}
}
