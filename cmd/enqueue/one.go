package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/internal/redisconn"
)

// connectTimeout bounds connecting to Redis.
const connectTimeout = 15 * time.Second

// runOne enqueues the notification the flags describe and prints its task ID.
func runOne(ctx context.Context, o *options, p process) error {
	switch {
	case o.to == "":
		return usagef("-to RECIPIENT is required to enqueue one notification")
	case o.template == "":
		return usagef("-template NAME is required to enqueue one notification")
	}
	c, err := loadChecker(o, p)
	if err != nil {
		return err
	}
	now := time.Now()
	e := intake.Entry{
		Recipient: o.to, Template: o.template, Policy: o.policy, Provider: o.provider,
		Queue: o.queue, Data: o.data, IdempotencyKey: o.key, SendBy: o.sendBy.time(now), TZ: o.tz,
		SendAt: o.sendAt.time(now), SendAtLocal: o.sendAtLocal, Tenant: o.tenant,
	}
	if _, err := c.Check(e, now); err != nil { // before connecting: a mistake is told without Redis
		return err
	}
	rdb, closeRedis, err := connect(ctx, c.Config)
	if err != nil {
		return err
	}
	defer closeRedis()
	j, err := c.Check(e, now) // again, in the shard of its queue that the workers serve
	if err != nil {
		return err
	}
	err = newProducer(rdb, c.Config, p.stderr).enqueue(ctx, j)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("task %s not enqueued: %w", j.ID, err)
	}
	fmt.Fprintln(p.stdout, j.ID)
	if err != nil {
		fmt.Fprintf(p.stderr, "enqueue: duplicate: task %s (idempotency key %s) is already in queue %s; not enqueued again\n",
			j.ID, intake.Quote(o.key), j.Queue)
	}
	return nil
}

// loadChecker loads the config -config names, REDIS_URL applied.
func loadChecker(o *options, p process) (intake.Checker, error) {
	cfg, err := config.LoadProducer(o.config, p.getenv)
	if err != nil {
		return intake.Checker{}, err
	}
	return intake.Checker{Config: cfg, Name: o.config}, nil
}

// connect connects to the config's Redis, and resolves the number of
// shards of each queue (redisconn.Shards) as the workers do.
func connect(ctx context.Context, cfg *config.Config) (redis.UniversalClient, func() error, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	rdb, closeRedis, err := redisconn.Connect(ctx, cfg.Redis)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Redis.Shards, err = redisconn.Shards(ctx, cfg.Redis, rdb); err != nil {
		closeRedis()
		return nil, nil, err
	}
	return rdb, closeRedis, nil
}
