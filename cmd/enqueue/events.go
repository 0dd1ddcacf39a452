package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/lifecycle"
)

// recordWithin bounds the recording of a notification's accepted event.
const recordWithin = 5 * time.Second

// producer enqueues checked notifications and records the accepted event
// of each (package lifecycle). A failure to record is said once on stderr:
// the notifications are enqueued all the same.
type producer struct {
	client *asynq.Client
	events *lifecycle.Recorder
	stderr io.Writer
	warned sync.Once
}

func newProducer(rdb redis.UniversalClient, cfg *config.Config, stderr io.Writer) *producer {
	return &producer{client: asynq.NewClientFromRedisClient(rdb), events: lifecycle.NewRecorder(rdb, cfg.EventOptions()), stderr: stderr}
}

// enqueue enqueues j (asynq.ErrTaskIDConflict: it was there already) and
// records its accepted event if it did.
func (p *producer) enqueue(ctx context.Context, j intake.Job) error {
	if _, err := p.client.EnqueueContext(ctx, j.Task); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWithin)
	defer cancel()
	err := p.events.Record(rctx, j.Accepted(lifecycle.ViaEnqueue)...)
	if err != nil {
		p.warned.Do(func() {
			fmt.Fprintf(p.stderr, "enqueue: warning: recording the accepted events failed (the notifications are enqueued): %v\n", err)
		})
	}
	return nil
}
