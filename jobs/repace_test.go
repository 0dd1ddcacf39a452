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

// Only the provider's notifications and digests are moved.
func TestProviderOf(t *testing.T) {
	msg := func(typ, payload string) string {
		return string(asynqdb.Message{Type: typ, Payload: []byte(payload), ID: "t1", Queue: "default"}.AppendTo(nil))
	}
	for _, tc := range []struct {
		name, msg string
		want      bool
	}{
		{"its notification", msg(TypeNotify, `{"provider":"sms"}`), true},
		{"its digest", msg(TypeDigest, `{"provider":"sms"}`), true},
		{"another provider's", msg(TypeNotify, `{"provider":"mail"}`), false},
		{"another type", msg("campaign:tick", `{"provider":"sms"}`), false},
		{"no hash", "", false},
	} {
		if got := providerOf(tc.msg, "sms"); got != tc.want {
			t.Errorf("%s: providerOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}
