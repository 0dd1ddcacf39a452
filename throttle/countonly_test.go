package throttle

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCountOnly checks that a count-only take is recorded, so that the rule
// holds back the traffic it binds, but never holds back its own request:
// with the rule full, plain and booking; and that a release gives it back.
func TestCountOnly(t *testing.T) {
	for _, c := range []struct {
		name          string
		book, cluster bool
	}{{"plain", false, false}, {"booking", true, false}, {"cluster", false, true}, {"cluster booking", true, true}} {
		book := c.book
		t.Run(c.name, func(t *testing.T) {
			var l *Limiter
			if c.cluster {
				l, _ = newCluster(t)
			} else {
				l, _ = newStandalone(t)
			}
			ctx := context.Background()
			mkt := mustQuota(t, "marketing", Window{1, time.Hour})
			reset := mustQuota(t, "reset", Window{5, time.Hour})
			b := mustBucket(t, "sms", 100, 10)
			resetReq := func(id string) Request {
				return Request{ID: id, book: booked(book), MaxWait: time.Second, Takes: []Take{
					{Rule: reset, Subject: "alice"}, {Rule: b, Subject: "sms"}, {Rule: mkt, Subject: "alice", CountOnly: true}}}
			}
			mktReq := Request{ID: "promo", book: booked(book), MaxWait: time.Second, Takes: []Take{{Rule: mkt, Subject: "alice"}, {Rule: b, Subject: "sms"}}}
			if d := mustAdmit(t, l, resetReq("reset-1")); !d.Allowed() {
				t.Fatalf("first reset: %+v, want allowed", d)
			}
			// Marketing is now full for alice: the reset counted.
			if d := mustAdmit(t, l, mktReq); d.Allowed() || d.TakeIndex != 0 || d.Delay < 59*time.Minute {
				t.Fatalf("marketing after a reset: %+v, want held back an hour by marketing", d)
			}
			if book {
				if _, err := l.Release(ctx, mktReq); err != nil {
					t.Fatal(err)
				}
			}
			// A second reset goes though marketing is full.
			d := mustAdmit(t, l, resetReq("reset-2"))
			if !d.Allowed() || d.TakeIndex == 2 {
				t.Fatalf("second reset with marketing full: %+v, want allowed, marketing binding nothing", d)
			}
			// Given back, the two resets leave marketing free.
			for _, id := range []string{"reset-1", "reset-2"} {
				if _, err := l.Release(ctx, resetReq(id)); err != nil {
					t.Fatal(err)
				}
			}
			if d := mustAdmit(t, l, mktReq); !d.Allowed() {
				t.Fatalf("marketing after the resets were given back: %+v, want allowed", d)
			}
		})
	}
}

func TestCountOnlyOnlyForQuotas(t *testing.T) {
	l, _ := newStandalone(t)
	b := mustBucket(t, "sms", 100, 10)
	_, err := l.Admit(context.Background(), Request{ID: "x", Takes: []Take{{Rule: b, Subject: "sms", CountOnly: true}}})
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("a count-only bucket take: %v, want ErrInvalidRequest", err)
	}
}
