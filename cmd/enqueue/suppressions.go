package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/notify-throttle/throttler/screen"
)

// runSuppressions lists a provider's suppressed addresses: those its
// service said are dead, to which the workers archive messages unsent.
func runSuppressions(ctx context.Context, o *options, p process) error {
	scr, closeRedis, err := openScreen(ctx, o, p, "suppressions", o.suppressions)
	if err != nil {
		return err
	}
	defer closeRedis()
	sups, err := scr.Suppressions(ctx, o.suppressions)
	if err != nil {
		return err
	}
	if len(sups) == 0 {
		fmt.Fprintf(p.stderr, "enqueue: provider %s has no suppressed addresses\n", o.suppressions)
		return nil
	}
	w := tabwriter.NewWriter(p.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ADDRESS\tSINCE\tREASON")
	for _, s := range sups {
		fmt.Fprintf(w, "%s\t%s\t%s\n", s.Address, s.At.Format(time.RFC3339), s.Reason)
	}
	return w.Flush()
}

// runUnsuppress lifts the suppression of one address: -unsuppress
// PROVIDER:ADDRESS (the address may hold colons, as FCM tokens do).
func runUnsuppress(ctx context.Context, o *options, p process) error {
	provider, address, ok := strings.Cut(o.unsuppress, ":")
	if !ok || provider == "" || address == "" {
		return usagef("-unsuppress takes PROVIDER:ADDRESS (got %q)", o.unsuppress)
	}
	scr, closeRedis, err := openScreen(ctx, o, p, "unsuppress", provider)
	if err != nil {
		return err
	}
	defer closeRedis()
	lifted, err := scr.Unsuppress(ctx, provider, address)
	if err != nil {
		return err
	}
	if !lifted {
		return fmt.Errorf("provider %s had no suppression of that address", provider)
	}
	fmt.Fprintf(p.stderr, "enqueue: lifted the suppression for provider %s\n", provider)
	return nil
}

// openScreen loads the config, checks that it defines provider (named by
// -flag) and connects to its Redis's lists of suppressions.
func openScreen(ctx context.Context, o *options, p process, flag, provider string) (*screen.Screen, func() error, error) {
	c, err := loadChecker(o, p)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := c.Config.Providers[provider]; !ok {
		return nil, nil, usagef("-%s: provider %q is not defined in %s", flag, provider, o.config)
	}
	rdb, closeRedis, err := connect(ctx, c.Config)
	if err != nil {
		return nil, nil, err
	}
	return screen.New(rdb, c.Config.Redis.Prefix), closeRedis, nil
}
