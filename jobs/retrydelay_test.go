package jobs

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
)

func TestRetryDelayTakesABackoffsDelayAndCountsItAFailure(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", &providers.Backoff{Delay: 7 * time.Second, Err: errors.New("503")})
	if got := RetryDelay(time.Second)(3, err, asynq.NewTask(message.TaskType, nil)); got != 7*time.Second {
		t.Errorf("RetryDelay = %s, want the backoff's 7s exactly", got)
	}
	if !IsFailure(err) {
		t.Error("a backoff is not counted as a failure: a provider's max_retries would never be reached")
	}
}
