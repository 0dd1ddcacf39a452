package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/jobs"
)

// sentCounts counts what providers accepted, per recipient, for the demo summary.
type sentCounts struct {
	mu   sync.Mutex
	sent map[string]int
}

func newSentCounts() *sentCounts { return &sentCounts{sent: map[string]int{}} }

func (c *sentCounts) wrap(p jobs.Provider) jobs.Provider {
	return jobs.ProviderFunc(func(ctx context.Context, m jobs.Message) error {
		err := p.Send(ctx, m)
		if err == nil {
			c.mu.Lock()
			c.sent[m.Recipient]++
			c.mu.Unlock()
		}
		return err
	})
}

// runDemo enqueues a burst for a few recipients under the default policy and
// provider, lets the worker run for d, and prints a summary per recipient.
func runDemo(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, d time.Duration, counts *sentCounts, out io.Writer) error {
	client := asynq.NewClientFromRedisClient(rdb)
	recipients := []string{"alice@example.com", "bob@example.com", "carol@example.com", "dave@example.com"}
	route := cfg.Route(config.Route{})
	enqueued := map[string]int{}
	for i := 0; i < 5; i++ {
		for _, r := range recipients {
			n := jobs.Notification{Recipient: r, Policy: route.Policy, Provider: route.Provider,
				Template: "weekly-digest", Data: []byte(fmt.Sprintf(`{"issue":%d}`, i+1))}
			task, err := jobs.NewTask(n, jobs.TaskID(""), asynq.Queue(route.Queue))
			if err != nil {
				return err
			}
			if _, err := client.EnqueueContext(ctx, task); err != nil {
				return fmt.Errorf("demo: enqueue: %w", err)
			}
			enqueued[r]++
		}
	}
	fmt.Fprintf(out, "demo: enqueued %d notifications for %d recipients under policy %s via %s; running %s\n",
		5*len(recipients), len(recipients), route.Policy, route.Provider, d)
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	counts.mu.Lock()
	defer counts.mu.Unlock()
	sort.Strings(recipients)
	fmt.Fprintf(out, "\n%-20s %8s %5s %9s\n", "recipient", "enqueued", "sent", "deferred")
	for _, r := range recipients {
		fmt.Fprintf(out, "%-20s %8d %5d %9d\n", r, enqueued[r], counts.sent[r], enqueued[r]-counts.sent[r])
	}
	return nil
}
