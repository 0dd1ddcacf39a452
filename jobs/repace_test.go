package jobs

import (
	"testing"
	"time"

	"github.com/notify-throttle/throttler/internal/asynqdb"
)

// A retry score stands for the moment wakeEarly and half a second after
// it; that moment scales around now, and the score moves with it. A task
// due by now stays.
func TestWakeScaled(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		score float64
		k     float64
		want  int64
		moved bool
	}{
		{"raised 2x", 1010, 0.5, 1004, true},   // its moment 1012 -> 1006
		{"lowered 2x", 1010, 2, 1022, true},    // 1012 -> 1024
		{"due by now", 998, 0.5, 998, false},   // its moment 1000 is now's
		{"a second ahead", 999, 4, 1002, true}, // 1001 -> 1004
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, moved := wakeScaled(tc.score, now, tc.k)
			if got != tc.want || moved != tc.moved {
				t.Errorf("wakeScaled(%v, k %v) = %d, %v; want %d, %v", tc.score, tc.k, got, moved, tc.want, tc.moved)
			}
		})
	}
}

// Only notifications and digests are read, with their provider and tenant.
func TestRouteOf(t *testing.T) {
	msg := func(typ, payload string) string {
		return string(asynqdb.Message{Type: typ, Payload: []byte(payload), ID: "t1", Queue: "default"}.AppendTo(nil))
	}
	for _, tc := range []struct {
		name, msg string
		want      bool
	}{
		{"its notification", msg(TypeNotify, `{"provider":"sms","tenant":"acme"}`), true},
		{"its digest", msg(TypeDigest, `{"provider":"sms","tenant":"acme"}`), true},
		{"another provider's", msg(TypeNotify, `{"provider":"mail","tenant":"acme"}`), false},
		{"another type", msg("campaign:tick", `{"provider":"sms","tenant":"acme"}`), false},
		{"no hash", "", false},
	} {
		provider, tenant, ok := routeOf(tc.msg)
		if got := ok && provider == "sms"; got != tc.want {
			t.Errorf("%s: routeOf = %q, %q, %v; want provider sms: %v", tc.name, provider, tenant, ok, tc.want)
		}
		if tc.want && tenant != "acme" {
			t.Errorf("%s: tenant %q, want acme", tc.name, tenant)
		}
	}
}
