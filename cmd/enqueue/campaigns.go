package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/campaign"
)

// listedTicks is how many next fire times -campaigns shows per campaign.
const listedTicks = 3

// runCampaigns lists the config's campaigns with their next fire times. It
// needs no Redis: the schedules are the config's.
func runCampaigns(_ context.Context, o *options, p process) error {
	c, err := loadChecker(o, p)
	if err != nil {
		return err
	}
	entries, err := campaign.List(c.Config, time.Now(), listedTicks)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		fmt.Fprintf(p.stderr, "enqueue: %s defines no campaigns\n", o.config)
		return nil
	}
	w := tabwriter.NewWriter(p.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CAMPAIGN\tSCHEDULE\tZONE\tAUDIENCE\tQUEUE\tNEXT")
	for _, e := range entries {
		next := make([]string, len(e.Next))
		for i, t := range e.Next {
			next[i] = t.Format(time.RFC3339)
		}
		if len(next) == 0 {
			next = []string{"never"}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, e.Cron, cmp.Or(e.Timezone, "UTC"), e.Audience, e.Queue, strings.Join(next, ", "))
	}
	return w.Flush()
}

// runTrigger fires one campaign now: its fan-out task is enqueued as the
// schedule would at this second, and the workers send it.
func runTrigger(ctx context.Context, o *options, p process) error {
	if o.trigger == "" {
		return usagef("-trigger needs a campaign name (enqueue -campaigns lists them)")
	}
	c, err := loadChecker(o, p)
	if err != nil {
		return err
	}
	rdb, closeRedis, err := connect(ctx, c.Config)
	if err != nil {
		return err
	}
	defer closeRedis()
	tick, err := campaign.Trigger(ctx, asynq.NewClientFromRedisClient(rdb), c.Config, o.trigger, time.Now())
	switch {
	case errors.Is(err, campaign.ErrUnknown):
		return fmt.Errorf("campaign %q is not defined in %s (enqueue -campaigns lists them)", o.trigger, o.config)
	case err != nil && !errors.Is(err, campaign.ErrAlreadyFired):
		return err
	}
	fmt.Fprintln(p.stdout, tick)
	if err != nil {
		fmt.Fprintf(p.stderr, "enqueue: %s has fired already (a scheduled tick or another trigger in the same second); not fired again\n", tick)
	}
	return nil
}
