package jobs

import (
	"testing"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/message"
)

// Only notifications and digests are read, with their provider and tenant.
func TestRouteOf(t *testing.T) {
	msg := func(typ, payload string) string {
		return string(asynqdb.Message{Type: typ, Payload: []byte(payload), ID: "t1", Queue: "default"}.AppendTo(nil))
	}
	for _, tc := range []struct {
		name, msg string
		want      bool
	}{
		{"its notification", msg(message.TaskType, `{"provider":"sms","tenant":"acme"}`), true},
		{"its digest", msg(digest.TaskType, `{"provider":"sms","tenant":"acme"}`), true},
		{"another provider's", msg(message.TaskType, `{"provider":"mail","tenant":"acme"}`), false},
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
