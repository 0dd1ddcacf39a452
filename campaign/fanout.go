package campaign

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/clip"
	"github.com/notify-throttle/throttler/message"
)

//go:embed *.lua
var scripts embed.FS

var claimScript, enqueueScript, batchScript, releaseScript = script("claim.lua"), script("enqueue.lua"), script("batch.lua"), script("release.lua")

func script(name string) *redis.Script {
	lua, _ := scripts.ReadFile(name) // embedded: it is there
	return redis.NewScript(string(lua))
}

// errLeaseLost says another run took the fan-out over: this one stops.
var errLeaseLost = errors.New("campaign: fan-out taken over by another worker")

// logInvalid is how many invalid entries a run logs; the rest are counted.
const logInvalid = 10

// Summary is what one tick's fan-out did, all runs together.
type Summary struct {
	Tick Tick
	// Read counts the audience entries read, valid or not, as each batch
	// is checkpointed: a crash never counts one twice.
	Read     int64
	Enqueued int64
	// Existing counts recipients already there: repeated in the audience
	// (or by SSCAN), or whose task exists already.
	Existing int64
	Invalid  int64 // entries skipped: blank, too long, not UTF-8
	// Done: the fan-out finished; Expired: it stopped because its
	// messages' send-by had passed.
	Done, Expired bool
	// Holder is the lease of the run fanning it out now, which names its
	// worker ("<host>/<pid>/<random>"); "" when none does (Progress only).
	Holder string
}

// ProcessTask fans out the tick in t's payload: the asynq.Handler of
// TypeFanout. A tick another worker fans out, or fanned out, succeeds at
// once; a failure is retried, from the checkpoint.
func (r *Runner) ProcessTask(ctx context.Context, t *asynq.Task) error {
	tick, err := decodeTick(t.Payload())
	if err != nil {
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	}
	c := r.campaigns[tick.Campaign]
	if c == nil {
		return fmt.Errorf("campaign %q is not in this worker's config: %w", tick.Campaign, asynq.SkipRetry)
	}
	if age := time.Since(tick.Time()); age > c.keep() {
		return fmt.Errorf("tick %s is %s old, older than its progress is kept: %w", tick, age.Round(time.Second), asynq.SkipRetry)
	}
	_, err = r.fanOut(ctx, c, tick, "start")
	if errors.Is(err, errLeaseLost) {
		return nil
	}
	return err
}

// fanOut runs tick's fan-out from its checkpoint until the audience ends,
// ctx ends or another run takes it over. mode is claim.lua's ARGV[7].
func (r *Runner) fanOut(ctx context.Context, c *campaign, tick Tick, mode string) (Summary, error) {
	ctx, cancel := r.bind(ctx)
	defer cancel()
	k := keysOf(r.prefix, c.Queue, tick)
	sum := Summary{Tick: tick}
	token := newToken()
	res, err := claimScript.Run(ctx, r.rdb, []string{k.progress, k.lease, k.running},
		token, r.opts.Lease.Milliseconds(), runningMember(tick), tick.Unix, int64(c.keep()/time.Second), time.Now().Unix(), mode).StringSlice()
	if err != nil {
		return sum, fmt.Errorf("campaign: claim %s: %w", tick, err)
	}
	switch res[0] {
	case "done":
		r.log.Info("campaign tick already fanned out", "campaign", tick.Campaign, "tick", tick.Time())
		sum.Done = true
		return sum, nil
	case "busy":
		r.log.Info("campaign tick being fanned out by another worker", "campaign", tick.Campaign, "tick", tick.Time())
		return sum, nil
	case "gone":
		r.log.Warn("campaign fan-out abandoned too long ago to resume safely: dropped", "campaign", tick.Campaign, "tick", tick.Time())
		return sum, nil
	}
	progress := fields(res[1:])
	line, _ := strconv.ParseInt(progress["line"], 10, 64)
	run := &batchRun{r: r, c: c, tick: tick, keys: k, token: token, pos: progress["pos"], line: line}
	defer run.release(ctx)

	resumed := progress["pos"] != ""
	if resumed {
		r.log.Info("campaign fan-out resuming", "campaign", tick.Campaign, "tick", tick.Time(),
			"from_line", progress["line"], "enqueued_before", progress["enqueued"])
	}
	if c.SendByWindow > 0 && time.Now().After(tick.Time().Add(c.SendByWindow)) {
		sum, err = run.send(ctx, nil, run.pos, "expired")
		if err == nil {
			r.log.Warn("campaign fan-out stopped: its send-by passed", "campaign", tick.Campaign, "tick", tick.Time(),
				"send_by", tick.Time().Add(c.SendByWindow), "enqueued", sum.Enqueued)
		}
		return sum, err
	}
	if err := r.rdb.SAdd(ctx, asynqdb.AllQueues, r.shardsOf(c.Queue)).Err(); err != nil {
		return sum, fmt.Errorf("campaign: register queue %s: %w", c.Queue, err)
	}
	src, err := openAudience(r.rdb, c.Audience, run.pos, line)
	if err != nil {
		return sum, err
	}
	defer src.Close()
	// One goroutine reads and encodes the next batch while Redis runs this one.
	start := time.Now()
	pctx, stop := context.WithCancel(ctx)
	batches := make(chan batch, 1)
	go run.produce(pctx, src, batches)
	defer func() {
		stop()
		for range batches { // until the producer is done with src
		}
	}()
	for a := range batches {
		if a.err != nil {
			return sum, a.err
		}
		if sum, err = run.exec(ctx, a); err != nil {
			return sum, err
		}
	}
	if !sum.Done {
		return sum, fmt.Errorf("campaign: fan-out of %s stopped: %w", tick, context.Cause(ctx))
	}
	r.log.Info("campaign fan-out done", "campaign", tick.Campaign, "tick", tick.Time(), "audience", c.Audience.String(),
		"read", sum.Read, "enqueued", sum.Enqueued, "already_there", sum.Existing, "invalid", sum.Invalid,
		"resumed", resumed, "took", time.Since(start).Round(time.Millisecond))
	if sum.Read == 0 {
		r.log.Warn("campaign audience is empty", "campaign", tick.Campaign, "audience", c.Audience.String())
	}
	return sum, nil
}

// batchRun is one run of a tick's fan-out, holding its lease.
type batchRun struct {
	r        *Runner
	c        *campaign
	tick     Tick
	keys     tickKeys
	token    string
	pos      string // where the progress stands
	line     int64  // file lines before pos
	logged   int    // invalid entries logged
	released bool
}

// batch is a batch of the audience encoded: the ARGV of enqueue.lua and
// batch.lua that are not the run's.
type batch struct {
	from, to string           // positions before and after it
	line     int64            // file lines read up to to
	read     int              // audience entries in it, valid or not
	invalid  int              // invalid entries in it
	done     string           // "1": it ends the fan-out; "expired": its send-by passed; else "0"
	tasks    map[string][]any // by shard: recipient, task ID, task message (asynqdb.Message); repeated
	err      error            // reading it failed
}

// produce reads the audience from the run's position and sends the
// batches to out until the audience ends, reading fails or ctx ends; then
// it closes out.
func (b *batchRun) produce(ctx context.Context, src reader, out chan<- batch) {
	defer close(out)
	from, line := b.pos, b.line
	for {
		entries, to, end, err := src.next(ctx, b.r.opts.Batch)
		a := batch{err: err}
		if err == nil {
			done := "0"
			if end {
				done = "1"
			}
			a = b.prepare(entries, from, to, line, done)
		}
		select {
		case out <- a:
		case <-ctx.Done():
			return
		}
		if err != nil || end {
			return
		}
		from, line = to, a.line
	}
}

// send enqueues entries, which end at position pos, and checkpoints.
func (b *batchRun) send(ctx context.Context, entries []entry, pos string, done string) (Summary, error) {
	return b.exec(ctx, b.prepare(entries, b.pos, pos, b.line, done))
}

// prepare encodes entries, from position from to position to, line being
// the file lines before them; invalid entries are counted and logged.
func (b *batchRun) prepare(entries []entry, from, to string, line int64, done string) batch {
	c, tick := b.c, b.tick
	var sendBy *time.Time
	if c.SendByWindow > 0 {
		t := tick.Time().Add(c.SendByWindow)
		sendBy = &t
	}
	a := batch{from: from, to: to, read: len(entries), done: done, tasks: map[string][]any{}}
	for _, e := range entries {
		line = max(line, e.line)
		msg, why := b.message(e, sendBy)
		if why != "" {
			a.invalid++
			b.logInvalid(e, why)
			continue
		}
		a.tasks[msg.Queue] = append(a.tasks[msg.Queue], e.recipient, msg.ID, msg.AppendTo(nil))
	}
	a.line = line
	return a
}

// exec enqueues a in its shards (enqueue.lua) and checkpoints it
// (batch.lua), and returns the fan-out's totals.
func (b *batchRun) exec(ctx context.Context, a batch) (Summary, error) {
	k, tick, now, keep := b.keys, b.tick, time.Now(), int64(b.c.keep()/time.Second)
	var enqueued []string
	existing := 0
	for _, shard := range slices.Sorted(maps.Keys(a.tasks)) {
		keys := []string{seenKey(b.r.prefix, shard, tick), asynqdb.PendingKey(shard)}
		args := append([]any{asynqdb.TaskKeyPrefix(shard), now.UnixNano(), keep}, a.tasks[shard]...)
		ids, err := enqueueScript.Run(ctx, b.r.rdb, keys, args...).StringSlice()
		if err != nil {
			return Summary{Tick: tick}, fmt.Errorf("campaign: enqueue batch of %s in %s: %w", tick, shard, err)
		}
		enqueued, existing = append(enqueued, ids...), existing+len(a.tasks[shard])/3-len(ids)
	}
	res, err := batchScript.Run(ctx, b.r.rdb, []string{k.progress, k.lease, k.running}, b.token, b.r.opts.Lease.Milliseconds(),
		a.from, a.to, a.line, a.read, a.invalid, a.done, keep, runningMember(tick), now.Unix(), len(enqueued), existing).Int64Slice()
	switch {
	case err != nil && (strings.HasPrefix(err.Error(), "LOST") || strings.HasPrefix(err.Error(), "MOVED")):
		b.released = true
		b.r.log.Warn("campaign fan-out taken over by another worker", "campaign", tick.Campaign, "tick", tick.Time(), "why", err)
		return Summary{Tick: tick}, errLeaseLost
	case err != nil:
		return Summary{Tick: tick}, fmt.Errorf("campaign: enqueue batch of %s: %w", tick, err)
	}
	b.pos, b.line = a.to, a.line
	b.accepted(ctx, enqueued)
	if a.done != "0" {
		b.released = true // the script dropped the lease
		seen := make([]string, 0, b.r.shards)
		for _, shard := range b.r.shardsOf(b.c.Queue) {
			seen = append(seen, seenKey(b.r.prefix, shard, tick))
		}
		b.r.forget(ctx, seen) // else they expire with the tick (keep)
	}
	return Summary{Tick: tick, Read: res[0], Enqueued: res[1], Existing: res[2], Invalid: res[3],
		Done: a.done != "0", Expired: a.done == "expired"}, nil
}

// message returns the notification task of e, or why e is not a recipient.
func (b *batchRun) message(e entry, sendBy *time.Time) (asynqdb.Message, string) {
	if e.bad != "" {
		return asynqdb.Message{}, e.bad
	}
	c := b.c
	id := b.tick.NotificationID(e.recipient)
	n := message.Notification{Recipient: e.recipient, Policy: c.Policy, Provider: c.Provider,
		Template: c.Template, Data: c.Data, SendBy: sendBy, Campaign: b.tick.String(), TZ: cmp.Or(e.tz, c.RecipientTZ),
		Tenant: c.Tenant}
	task, err := message.NewTask(n, id)
	var fe *message.FieldError
	switch {
	case errors.As(err, &fe):
		return asynqdb.Message{}, fe.Error() // the log names the entry and why it is invalid
	case err != nil:
		return asynqdb.Message{}, err.Error()
	}
	// As asynq's Client would store message.NewTask's task.
	return asynqdb.Message{Type: task.Type(), Payload: task.Payload(), ID: id, Queue: asynqdb.ShardOf(c.Queue, id, b.r.shards),
		Retry: message.DefaultMaxRetry, Headers: task.Headers()}, ""
}

func (b *batchRun) logInvalid(e entry, why string) {
	if b.logged++; b.logged > logInvalid {
		return
	}
	attrs := []any{"campaign", b.tick.Campaign, "tick", b.tick.Time(), "why", why}
	if e.line > 0 {
		attrs = append(attrs, "line", e.line)
	} else {
		attrs = append(attrs, "member", clip.Cut(e.recipient, 80, "..."))
	}
	if b.logged == logInvalid {
		attrs = append(attrs, "note", "further invalid entries of this run are only counted")
	}
	b.r.log.Warn("campaign audience entry skipped", attrs...)
}

// release gives the lease back when the run stops for a shutdown, so that
// another worker resumes at once. After a failure the lease is left to
// expire: the fan-out task's retry comes anyway.
func (b *batchRun) release(ctx context.Context) {
	if b.released || ctx.Err() == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := releaseScript.Run(ctx, b.r.rdb, []string{b.keys.lease}, b.token).Err(); err != nil {
		b.r.log.Warn("campaign: releasing a fan-out's lease failed; it expires on its own", "tick", b.tick.String(), "err", err)
	}
}

// Progress returns what tick's fan-out has done so far, and who runs it
// now; a zero Summary when it has not started or its record expired
// (a day after the tick, or catch_up + 1h if longer).
func (r *Runner) Progress(ctx context.Context, tick Tick) (Summary, error) {
	c := r.campaigns[tick.Campaign]
	if c == nil {
		return Summary{}, fmt.Errorf("campaign: %w: %q", ErrUnknown, tick.Campaign)
	}
	var read func() (Summary, bool)
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		read = readProgress(ctx, p, keysOf(r.prefix, c.Queue, tick), tick)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Summary{}, err
	}
	s, _ := read()
	return s, nil
}

// readProgress queues on p the reads of tick's progress and lease; the
// function it returns gives them once p has run, and reports whether any
// progress was recorded.
func readProgress(ctx context.Context, p redis.Pipeliner, k tickKeys, tick Tick) func() (Summary, bool) {
	counts := p.HMGet(ctx, k.progress, "read", "enqueued", "existing", "invalid", "done", "expired")
	holder := p.Get(ctx, k.lease)
	return func() (Summary, bool) {
		v := counts.Val()
		s := func(j int) string { x, _ := v[j].(string); return x }
		n := func(j int) int64 { x, _ := strconv.ParseInt(s(j), 10, 64); return x }
		return Summary{Tick: tick, Read: n(0), Enqueued: n(1), Existing: n(2), Invalid: n(3),
			Done: s(4) == "1", Expired: s(5) == "1", Holder: holder.Val()}, v[0] != nil
	}
}

func runningMember(t Tick) string { return t.Campaign + ":" + strconv.FormatInt(t.Unix, 10) }

func parseMember(m string) (Tick, bool) {
	i := strings.LastIndexByte(m, ':')
	if i <= 0 {
		return Tick{}, false
	}
	u, err := strconv.ParseInt(m[i+1:], 10, 64)
	return Tick{Campaign: m[:i], Unix: u}, err == nil
}

// fields turns HGETALL's flat reply into a map.
func fields(kv []string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// newToken returns a lease token unique to one run that also names its
// worker: "<host>/<pid>/<random>".
func newToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}
