package jobs

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestRetryDelayRoundsUpAndJitters(t *testing.T) {
	tests := []struct {
		delay    time.Duration
		min, max time.Duration // max exclusive
	}{
		{250 * time.Millisecond, 2 * time.Second, 2*time.Second + time.Second},
		{time.Second, 2 * time.Second, 3 * time.Second},
		{17*time.Hour + 2*time.Minute + 300*time.Millisecond, 17*time.Hour + 2*time.Minute + 2*time.Second, 17*time.Hour + 2*time.Minute + 3*time.Second},
	}
	f := RetryDelay(time.Second)
	for _, tc := range tests {
		t.Run(tc.delay.String(), func(t *testing.T) {
			for i := 0; i < 50; i++ {
				err := fmt.Errorf("wrapped: %w", &Deferral{Delay: tc.delay, Reason: "x"})
				got := f(3, err, nil)
				if got < tc.min || got >= tc.max {
					t.Fatalf("RetryDelay(%s) = %s, want in [%s, %s)", tc.delay, got, tc.min, tc.max)
				}
			}
		})
	}
	// A real failure gets asynq's backoff, which is random: n⁴ + 15 s plus
	// up to 30·(n+1) s (comparing with a second draw of it was flaky).
	other := errors.New("502 Bad Gateway")
	for n := range 4 {
		lo := time.Duration(n*n*n*n+15) * time.Second
		hi := lo + time.Duration(30*(n+1))*time.Second
		for range 50 {
			if got := f(n, other, nil); got < lo || got >= hi {
				t.Fatalf("a real failure after %d retries waits %s; want asynq's backoff in [%s, %s)", n, got, lo, hi)
			}
		}
	}
}

func TestDeferralIsNotAFailure(t *testing.T) {
	if IsFailure(fmt.Errorf("x: %w", &Deferral{Delay: time.Second})) {
		t.Error("a deferral counted as a failure")
	}
	if !IsFailure(errors.New("boom")) {
		t.Error("a real error did not count as a failure")
	}
}

func TestDeferralMessage(t *testing.T) {
	d := &Deferral{Delay: 17*time.Hour + 2*time.Minute + 5*time.Second, Reason: "throttled by policy marketing (3 per 168h)"}
	if got, want := d.Error(), "throttled by policy marketing (3 per 168h); next try in 17h2m"; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
