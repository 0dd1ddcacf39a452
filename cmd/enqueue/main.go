// Command enqueue puts notification jobs on the queue for the workers, lists
// and fires campaigns, and lists and lifts suppressions. Its usage is what -h
// prints (usage, below); docs/design.md#enqueueing-notifications describes
// it. make release names the binary throttler-enqueue; go build, enqueue.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // time zones also on hosts without zoneinfo files

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/buildinfo"
)

// name is the release binary's name, for -version; messages say "enqueue:".
const name = "throttler-enqueue"

func main() {
	// go-redis logs failed dials to stderr on its own; enqueue reports
	// errors itself, once, so that stderr stays what the contract says.
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second SIGINT kills it; the first lets it report
	code := run(ctx, os.Args[1:], process{
		stdin:    os.Stdin,
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		terminal: os.Getenv("TERM") != "dumb" && isTerminal(os.Stderr),
	})
	stop()
	os.Exit(code)
}

// quiet is a go-redis logger that drops everything.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// process is what run takes from the process it runs in, so that tests can
// supply their own.
type process struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string // the environment (REDIS_URL)
	terminal       bool                // stderr is a terminal: -file shows a progress bar
}

// run runs enqueue with args and returns its exit status.
func run(ctx context.Context, args []string, p process) int {
	return exitStatus(enqueue(ctx, args, p), p.stderr)
}

// Exit statuses.
const (
	exitOK       = 0
	exitRejected = 1 // a notification was rejected, or an error stopped enqueue
	exitUsage    = 2
)

// usageError is a mistake on the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errReported means the problem was already written to stderr.
var errReported = errors.New("enqueue: reported")

// exitStatus writes err to stderr, unless it was reported already, and
// returns the exit status it calls for.
func exitStatus(err error, stderr io.Writer) int {
	var usage *usageError
	var cfgErr *config.Error
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "enqueue: %s\nRun 'enqueue -h' for usage.\n", usage.msg)
		return exitUsage
	case errors.Is(err, errReported):
	case errors.As(err, &cfgErr):
		fmt.Fprintln(stderr, err) // file:line: path: message, which editors jump to
	default:
		fmt.Fprintln(stderr, "enqueue:", err)
	}
	return exitRejected
}

// enqueue parses the command line and runs the command it names.
func enqueue(ctx context.Context, args []string, p process) error {
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by exitStatus, -h by usage
	o := newOptions(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(p.stdout)
			usage(fs)
			return err
		}
		return &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q: flags come first, values need their flag", fs.Arg(0))
	}
	if o.version {
		fmt.Fprintln(p.stdout, name, buildinfo.Read())
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cmd, err := choose(set)
	if err != nil {
		return err
	}
	return cmd.run(ctx, o, p)
}

// command is one way of running enqueue. A new one is its flags in
// newOptions, an entry in commands and a run function.
type command struct {
	flags []string // the flags only it takes, which choose it; the first names it
	run   func(ctx context.Context, o *options, p process) error
}

func commands() []command {
	return []command{
		{flags: []string{"to", "template", "policy", "provider", "data", "queue", "key", "send-by", "send-at", "send-at-local", "tenant"}, run: runOne},
		{flags: []string{"file"}, run: runFile},
		{flags: []string{"campaigns"}, run: runCampaigns},
		{flags: []string{"trigger"}, run: runTrigger},
		{flags: []string{"suppressions"}, run: runSuppressions},
		{flags: []string{"unsuppress"}, run: runUnsuppress},
	}
}

// choose returns the command whose flags are set; a flag of another command
// set too is a usage error.
func choose(set map[string]bool) (command, error) {
	var chosen []command
	var by []string
	for _, c := range commands() {
		for _, f := range c.flags {
			if set[f] {
				chosen = append(chosen, c)
				by = append(by, f)
				break
			}
		}
	}
	switch len(chosen) {
	case 0:
		return command{}, usagef("nothing to enqueue: give -to and -template, -file, -campaigns, -trigger NAME, -suppressions PROVIDER or -unsuppress PROVIDER:ADDRESS")
	case 1:
		return chosen[0], nil
	}
	return command{}, usagef("-%s and -%s cannot be used together", by[0], by[1])
}

// usage prints the help text -h shows.
func usage(fs *flag.FlagSet) {
	fmt.Fprint(fs.Output(), `Usage:
  enqueue [-config config.yaml] -to RECIPIENT -template NAME [-policy P] [-provider P]
          [-data '{"k":"v"}'] [-queue Q] [-key IDEMPOTENCY_KEY] [-send-by TIME|DURATION] [-tz ZONE]
          [-send-at TIME|DURATION | -send-at-local HH:MM] [-tenant NAME]
  enqueue [-config config.yaml] -file notifications.jsonl   (-file - reads stdin)
  enqueue [-config config.yaml] -campaigns                  (list, with next fire times)
  enqueue [-config config.yaml] -trigger CAMPAIGN           (fire one now)
  enqueue [-config config.yaml] -suppressions PROVIDER      (list its dead addresses)
  enqueue [-config config.yaml] -unsuppress PROVIDER:ADDRESS (lift one)

Enqueues notification jobs for the workers: one from flags, printing its task ID
on stdout, or one per line of a JSONL file, with a summary on stderr. Each
notification is checked against the config first: its policy, provider and
queue must be defined there, and the config's defaults fill in what it leaves
out. A bad line is reported as FILE:LINE: message and skipped. With an
idempotency key the task ID is derived from the key, so enqueueing the same
notification again (within 24h of its delivery) is a duplicate, not a second job.
A scheduled notification (-send-at, -send-at-local) waits in the queue's
schedule until its moment, then goes through every rule from then.

Examples:
  enqueue -to alice@example.com -template welcome -data '{"name":"Alice"}'
  enqueue -to +15551234567 -template otp -policy transactional -provider sms \
          -queue critical -key otp-7f3a -send-by 5m
  enqueue -to bob@example.com -template digest -send-by 2026-11-22T10:00:00Z
  enqueue -to bob@example.com -template reminder -send-at 2026-11-22T09:00:00Z
  enqueue -to bob@example.com -template reminder -send-at-local 09:00 -tz Europe/Paris
  enqueue -config prod.yaml -file notifications.jsonl
  zcat big.jsonl.gz | enqueue -file -
  REDIS_URL=redis://127.0.0.1:6379/0 enqueue -file notifications.jsonl
  enqueue -campaigns
  enqueue -trigger weekly-digest    # prints the tick, e.g. weekly-digest@2026-11-21T09:00:00Z
  enqueue -suppressions push        # ADDRESS SINCE REASON, one line each
  enqueue -unsuppress push:dXyz:APA91b...   # the next message to it is sent

A suppressed address is one a provider's service said is dead (an unregistered
device, an invalid or unsubscribed number): the workers archive messages to it
without sending, with the reason. See docs/providers.md.

One JSONL line (recipient and template required, unknown fields rejected):
  {"recipient":"alice@example.com","template":"welcome","policy":"marketing",
   "provider":"console","queue":"default","data":{"name":"Alice"},
   "idempotency_key":"welcome-alice","send_by":"2026-11-22T10:00:00Z",
   "tenant":"growth"}
  scheduled: "send_at":"2026-11-22T09:00:00Z", or "send_at_local":"09:00" with
   "tz":"Europe/Paris" (the next 09:00 there; else in the policy's timezone)

Exit status: 0 all enqueued (duplicates count as done), 1 a notification was
rejected or an error stopped enqueue (it says from which line to resume),
2 a mistake on the command line. REDIS_URL overrides redis.url.

Flags:
`)
	fs.PrintDefaults()
}
