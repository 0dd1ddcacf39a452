package main

import (
	"encoding/json"
	"errors"
	"flag"
	"time"

	"github.com/notify-throttle/throttler/intake"
)

// options holds the flags of every command.
type options struct {
	config string

	// One notification (runOne).
	to, template, policy, provider, queue, key, tz, tenant string
	data                                                   json.RawMessage
	sendBy, sendAt                                         moment
	sendAtLocal                                            string

	// A JSONL file (runFile).
	file string

	// Campaigns: list them (runCampaigns), fire one now (runTrigger).
	campaigns bool
	trigger   string

	version bool // print the version and exit
	// Suppressed addresses: list a provider's, lift one.
	suppressions string
	unsuppress   string
}

// newOptions defines the flags on fs.
func newOptions(fs *flag.FlagSet) *options {
	o := &options{}
	fs.StringVar(&o.config, "config", "config.yaml", "the config `file`")
	fs.StringVar(&o.to, "to", "", "the `recipient` of one notification")
	fs.StringVar(&o.template, "template", "", "the template `name`")
	fs.StringVar(&o.policy, "policy", "", "the recipient policy (default: defaults.policy)")
	fs.StringVar(&o.provider, "provider", "", "the provider (default: defaults.provider)")
	fs.Func("data", "the template data, a JSON `object`", func(s string) error {
		if !json.Valid([]byte(s)) || intake.JSONKind([]byte(s)) != "object" {
			return errors.New("must be a JSON object")
		}
		o.data = json.RawMessage(s)
		return nil
	})
	fs.StringVar(&o.queue, "queue", "", "the queue (default: defaults.queue)")
	fs.StringVar(&o.key, "key", "", "the idempotency `key`: the same key makes the same task ID")
	fs.StringVar(&o.tz, "tz", "", "the recipient's IANA time `zone` (America/New_York) for its policy's calendar windows and quiet hours (default: the policy's timezone)")
	fs.StringVar(&o.tenant, "tenant", "", "the tenant `name`: the sender (a team, a product) whose fair share of the provider the notification uses, weighted by tenants.weights; at most 256 bytes, no control characters (default: the tenant shared by notifications that name none)")
	fs.Var(&o.sendBy, "send-by", "the deadline, an RFC 3339 `time` or a duration from now (90m); later it expires")
	fs.Var(&o.sendAt, "send-at", "send it at this moment, not before: an RFC 3339 `time` or a duration from now (10m); more than a minute past is refused")
	fs.StringVar(&o.sendAtLocal, "send-at-local", "", "send it at the next `HH:MM` (or HH:MM:SS) of the recipient's zone (-tz, else the policy's timezone); not with -send-at")
	fs.StringVar(&o.file, "file", "", "a JSONL `file` of notifications, one per line; - reads stdin")
	fs.BoolVar(&o.campaigns, "campaigns", false, "list the config's campaigns with their next fire times")
	fs.StringVar(&o.trigger, "trigger", "", "fire the campaign `name`d now: its audience is fanned out by the workers")
	fs.BoolVar(&o.version, "version", false, "print the version and the commit it was built from, and exit")
	fs.StringVar(&o.suppressions, "suppressions", "", "list the `provider`'s suppressed addresses (its service said they are dead)")
	fs.StringVar(&o.unsuppress, "unsuppress", "", "lift one suppression: `PROVIDER:ADDRESS`")
	return o
}

// moment is the value of -send-by and -send-at: an RFC 3339 time or a
// duration from now.
type moment struct {
	at time.Time
	in time.Duration
}

func (d *moment) String() string {
	switch {
	case !d.at.IsZero():
		return d.at.Format(time.RFC3339Nano)
	case d.in != 0:
		return d.in.String()
	}
	return ""
}

func (d *moment) Set(s string) error {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		*d = moment{at: t}
		return nil
	}
	in, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return errors.New("must be an RFC 3339 time (2026-11-22T10:00:00Z) or a duration from now (90m)")
	case in <= 0:
		return errors.New("must be a duration > 0")
	}
	*d = moment{in: in}
	return nil
}

// time returns the moment as a time, counting a duration from now, or nil
// when there is none.
func (d *moment) time(now time.Time) *time.Time {
	switch {
	case !d.at.IsZero():
		return &d.at
	case d.in != 0:
		t := now.Add(d.in).UTC()
		return &t
	}
	return nil
}
