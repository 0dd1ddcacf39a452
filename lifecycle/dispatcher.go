package lifecycle

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Dispatcher POSTs the events of the tenants with a callback to their
// endpoints, signed (Sign), at least once each, Options.Parallel at once
// per endpoint: receivers order a message's events by At. Every worker
// runs one, a consumer of each tenant's stream, with one loop per
// endpoint; retries, leases and a failing endpoint:
// docs/operations.md#events-and-status-callbacks ("Status callbacks").
type Dispatcher struct {
	rdb    redis.UniversalClient
	o      Options
	client *http.Client
}

// NewDispatcher returns the dispatcher of o.Callbacks on rdb.
func NewDispatcher(rdb redis.UniversalClient, o Options) *Dispatcher {
	o = o.withDefaults()
	o.Consumer = cmp.Or(o.Consumer, consumerName())
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = o.Parallel
	return &Dispatcher{rdb: rdb, o: o, client: &http.Client{
		Transport: transport,
		// A redirect is an answer that is not 2xx: followed, it would
		// carry the signed event somewhere the tenant did not configure.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func consumerName() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b)
}

// Run delivers until ctx ends, one loop per endpoint. The POSTs under way
// then are cut short; their events are retried, here or by another worker.
func (d *Dispatcher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, tenant := range slices.Sorted(maps.Keys(d.o.Callbacks)) {
		l := &lane{d: d, tenant: tenant, ep: d.o.Callbacks[tenant], stream: streamKey(d.o.Prefix, tenant)}
		wg.Go(func() { l.run(ctx) })
	}
	wg.Wait()
}

const (
	pendingScan  = 100              // pending events looked at per round for due retries
	gaugeEvery   = 10 * time.Second // how often the backlog gauge is read
	pruneEvery   = 10 * time.Minute // how often consumers gone idle are removed
	idleConsumer = time.Hour        // a consumer with nothing pending idle this long is gone
	warnEvery    = time.Minute      // an endpoint that keeps failing is logged this often
)

// lane is the loop of one endpoint.
type lane struct {
	d       *Dispatcher
	tenant  string
	ep      Endpoint
	stream  string
	grouped bool // the stream's group exists
	// failing: every POST of the last round failed. Until one succeeds,
	// each round POSTs one due event, and one new event a Backoff, so that
	// an endpoint refusing one event for good is found answering others.
	failing bool
	probed  time.Time // when failing last read a new event
	warned  time.Time // when failing was last logged
	gauged  time.Time
	pruned  time.Time
}

func (l *lane) run(ctx context.Context) {
	l.pruned = time.Now()
	for ctx.Err() == nil {
		worked, err := l.round(ctx)
		if err != nil && ctx.Err() == nil {
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				l.grouped = false // the stream was deleted (or Redis flushed)
			} else {
				l.d.o.Log.Warn("callbacks: reading the events failed", "tenant", l.tenant, "err", err)
			}
		}
		if err != nil || !worked && l.failing {
			sleep(ctx, l.d.o.Poll) // a round that read nothing new blocked already, unless failing
		}
		l.housekeep(ctx)
	}
}

// round POSTs the due retries and the new events (waiting up to Poll for
// some; while the endpoint is failing, one new event a Backoff): it
// reports whether there were any.
func (l *lane) round(ctx context.Context) (bool, error) {
	if !l.grouped {
		err := l.d.rdb.XGroupCreateMkStream(ctx, l.stream, Group, "0").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return false, err
		}
		l.grouped = true
	}
	entries, err := l.due(ctx)
	if err != nil {
		return false, err
	}
	want, block := l.d.o.Parallel-len(entries), l.d.o.Poll
	if len(entries) > 0 {
		block = -1 // no wait: there is work
	}
	if l.failing {
		want, block = 0, -1
		if time.Since(l.probed) >= l.d.o.Backoff {
			want, l.probed = 1, time.Now()
		}
	}
	if want > 0 {
		streams, err := l.d.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: l.d.o.Consumer,
			Streams: []string{l.stream, ">"}, Count: int64(want), Block: block}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, err
		}
		for _, s := range streams {
			entries = append(entries, s.Messages...)
		}
	}
	if len(entries) == 0 {
		return false, nil
	}
	return true, l.deliver(ctx, entries)
}

// lease is how long after it was read an event's POST is surely over.
func (l *lane) lease() time.Duration { return l.ep.timeout() + l.d.o.LeaseMargin }

// wait is how long after its last read an event tried tries times is due
// again: the backoff of its tries, never less than the lease.
func (l *lane) wait(tries int64) time.Duration {
	b := l.d.o.Backoff
	for i := int64(1); i < tries && b < l.d.o.MaxBackoff; i++ {
		b *= 2
	}
	return max(min(b, l.d.o.MaxBackoff), l.lease())
}

// due claims the pending events whose retry is due, oldest first: as many
// as a round POSTs, or one while the endpoint is failing. The claim takes
// an event only if it is still idle past the lease, so only one of two
// workers claiming it gets it.
func (l *lane) due(ctx context.Context) ([]redis.XMessage, error) {
	pending, err := l.d.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: l.stream, Group: Group,
		Idle: l.lease(), Start: "-", End: "+", Count: pendingScan}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	want := l.d.o.Parallel
	if l.failing {
		want = 1
	}
	var ids []string
	for _, p := range pending {
		if p.Idle >= l.wait(p.RetryCount) && len(ids) < want {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	msgs, err := l.d.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: l.stream, Group: Group, Consumer: l.d.o.Consumer,
		MinIdle: l.lease(), Messages: ids}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	return msgs, nil
}

// deliver POSTs the events of entries at once and acknowledges those
// delivered, given up or unreadable: they leave the stream.
func (l *lane) deliver(ctx context.Context, entries []redis.XMessage) error {
	m := l.d.o.Metrics
	var done, ids []string // to acknowledge; of events, to POST
	var events []Event
	for _, entry := range entries {
		body, _ := entry.Values["e"].(string)
		var e Event
		switch {
		case entry.ID == "":
			continue // deleted since it was read
		case json.Unmarshal([]byte(body), &e) != nil:
			l.d.o.Log.Warn("callbacks: an entry that is not an event: dropped", "tenant", l.tenant, "entry", entry.ID)
			done = append(done, entry.ID)
		case time.Since(entryTime(entry.ID)) > l.d.o.GiveUp:
			m.Callbacks.WithLabelValues(l.tenant, "given_up").Inc()
			l.d.o.Log.Warn("callbacks: event not delivered in time: given up", "tenant", l.tenant, "event", e.ID,
				"type", e.Type, "message", e.Message, "give_up_after", l.d.o.GiveUp)
			done = append(done, entry.ID)
		default:
			events, ids = append(events, e), append(ids, entry.ID)
		}
	}
	l.withKeys(ctx, events)
	errs := make([]error, len(events))
	var wg sync.WaitGroup
	for i := range events {
		wg.Go(func() { errs[i] = l.post(ctx, &events[i]) })
	}
	wg.Wait()
	var failed error
	delivered := 0
	for i, err := range errs {
		if err == nil {
			delivered++
			done = append(done, ids[i])
			m.Callbacks.WithLabelValues(l.tenant, "delivered").Inc()
		} else if ctx.Err() == nil {
			failed = err
			m.Callbacks.WithLabelValues(l.tenant, "failed").Inc()
		}
	}
	l.note(delivered, failed)
	return l.ack(context.WithoutCancel(ctx), done)
}

// note logs an endpoint that starts failing, once a warnEvery while it
// fails, and when it answers again.
func (l *lane) note(delivered int, failed error) {
	was := l.failing
	l.failing = delivered == 0 && failed != nil
	switch {
	case l.failing && (!was || time.Since(l.warned) >= warnEvery):
		l.warned = time.Now()
		l.d.o.Log.Warn("callbacks: the endpoint fails: its events wait and are retried", "tenant", l.tenant, "err", failed)
	case was && !l.failing:
		l.d.o.Log.Info("callbacks: the endpoint answers again", "tenant", l.tenant)
	}
}

// ack takes ids out of the group's pending list and out of the stream.
func (l *lane) ack(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := l.d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAck(ctx, l.stream, Group, ids...)
		p.XDel(ctx, l.stream, ids...)
		return nil
	})
	return err
}

// withKeys gives the events without an idempotency key their message's,
// from the accepted event at the head of its history.
func (l *lane) withKeys(ctx context.Context, events []Event) {
	var messages []string
	for _, e := range events {
		if e.Type != Accepted && e.IdempotencyKey == "" {
			messages = append(messages, e.Message)
		}
	}
	firsts, _ := heads(ctx, l.d.rdb, l.d.o.Prefix, messages)
	for i, e := range events {
		if first, ok := firsts[e.Message]; ok && e.Type != Accepted && e.IdempotencyKey == "" {
			events[i].IdempotencyKey = keyOf(first)
		}
	}
}

// post POSTs e to the endpoint, signed: nil if it answered 2xx.
func (l *lane) post(ctx context.Context, e *Event) error {
	body, err := json.Marshal(e)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.ep.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.ep.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "throttler-callbacks")
	req.Header.Set(EventIDHeader, e.ID)
	req.Header.Set(SignatureHeader, Sign(l.ep.Secret, time.Now(), body))
	res, err := l.d.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a token
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
	res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("answered %s", res.Status)
	}
	return nil
}

// housekeep sets the backlog gauge, and removes the group's consumers that
// have nothing pending and have been idle for idleConsumer: workers that
// stopped.
func (l *lane) housekeep(ctx context.Context) {
	if time.Since(l.gauged) >= gaugeEvery {
		l.gauged = time.Now()
		if n, err := l.d.rdb.XLen(ctx, l.stream).Result(); err == nil {
			l.d.o.Metrics.Backlog.WithLabelValues(l.tenant).Set(float64(n))
		}
	}
	if time.Since(l.pruned) < pruneEvery {
		return
	}
	l.pruned = time.Now()
	consumers, err := l.d.rdb.XInfoConsumers(ctx, l.stream, Group).Result()
	if err != nil {
		return
	}
	for _, c := range consumers {
		if c.Name != l.d.o.Consumer && c.Pending == 0 && c.Idle >= idleConsumer {
			l.d.rdb.XGroupDelConsumer(ctx, l.stream, Group, c.Name)
		}
	}
}

// entryTime is when a stream entry was added, from its ID ("<ms>-<seq>").
func entryTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return time.UnixMilli(n)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
