package jobs

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
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
	other := errors.New("502 Bad Gateway")
	if got, want := f(1, other, nil), asynq.DefaultRetryDelayFunc(1, other, nil); got > want+30*time.Second {
		t.Errorf("a real failure waits %s; want asynq's backoff", got)
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
