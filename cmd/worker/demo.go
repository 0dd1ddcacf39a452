package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// The demo runs the worker on rules scaled down to seconds, six
// notifications for each of four recipients enqueued at once.
const (
	demoPolicy   = "demo"
	demoProvider = "demo"
	demoEach     = 6
)

var (
	demoWindows    = []throttle.Window{{Limit: 1, Per: 2 * time.Second}, {Limit: 3, Per: 10 * time.Second}}
	demoRecipients = []string{"alice@example.com", "bob@example.com", "carol@example.com", "dave@example.com"}
)

// demoAddrs moves the demo's HTTP server and embedded Redis to free ports
// where the configured ones are taken (another worker, another demo), and
// says on out where each went.
func demoAddrs(cfg *config.Config, out io.Writer) {
	if addr, ok := freeIfTaken(cfg.Worker.HTTPAddr); ok {
		fmt.Fprintf(out, "demo: %s is taken: serving /healthz, /metrics and the dashboard on %s\n", cfg.Worker.HTTPAddr, addr)
		cfg.Worker.HTTPAddr = addr
	}
	if !cfg.Redis.IsEmbedded() {
		return
	}
	if addr, ok := freeIfTaken(cfg.Redis.EmbeddedAddr); ok {
		fmt.Fprintf(out, "demo: %s is taken: the embedded Redis listens on %s\n", cfg.Redis.EmbeddedAddr, addr)
		cfg.Redis.EmbeddedAddr = addr
	}
}

// freeIfTaken returns a free port on addr's host, and true, if addr is
// taken. The port is closed again: another process could take it first,
// which a demo can afford.
func freeIfTaken(addr string) (string, bool) {
	if addr == "" {
		return "", false
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		return "", false
	}
	host, _, splitErr := net.SplitHostPort(addr)
	if !errors.Is(err, syscall.EADDRINUSE) || splitErr != nil {
		return "", false
	}
	if ln, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err != nil {
		return "", false
	}
	defer ln.Close()
	return ln.Addr().String(), true
}

// demoRules adds the demo's policy and provider to cfg.
func demoRules(cfg *config.Config) {
	cfg.Policies[demoPolicy] = config.Policy{Windows: demoWindows, OverCap: config.OverCapDefer}
	cfg.Providers[demoProvider] = config.Provider{Type: config.ProviderLog, Rate: 2, Burst: 2, Output: os.DevNull}
}

// sentCounts records when providers accepted a message, per recipient, for
// the demo.
type sentCounts struct {
	mu        sync.Mutex
	start     time.Time
	out       io.Writer // each send is printed here; nil: not printed
	sent      map[string][]time.Time
	callbacks *demoReceiver // the demo's status callbacks (demo_events.go)
}

func newSentCounts() *sentCounts {
	return &sentCounts{start: time.Now(), sent: map[string][]time.Time{}}
}

// demoNumber reads the message number the demo puts in each payload.
func demoNumber(data []byte) int {
	var d struct{ N int }
	_ = json.Unmarshal(data, &d)
	return d.N
}

func (c *sentCounts) wrap(p providers.Provider) providers.Provider {
	return providers.Func(func(ctx context.Context, m providers.Message) (string, error) {
		id, err := p.Send(ctx, m)
		if err == nil {
			now := time.Now()
			c.mu.Lock()
			c.sent[m.Recipient] = append(c.sent[m.Recipient], now)
			if c.out != nil {
				scheduled := ""
				if m.Recipient == demoAPIRecipient {
					scheduled = " (the scheduled one, at its moment)"
				}
				fmt.Fprintf(c.out, "%7.2fs  sent    %-18s #%d%s\n", now.Sub(c.start).Seconds(), m.Recipient, demoNumber(m.Data), scheduled)
			}
			c.mu.Unlock()
		}
		return id, err
	})
}

// booked prints a booking as it is made (jobs.Throttle.OnBooked).
func (c *sentCounts) booked(n message.Notification, d throttle.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.out == nil {
		return
	}
	// The moment on this process's clock: Redis's embedded here.
	at := time.Now().Add(d.Delay)
	rule := fmt.Sprintf("provider %s", n.Provider)
	if _, ok := d.Rule.(*throttle.Quota); ok {
		rule = fmt.Sprintf("policy %s (%s)", n.Policy, d.Limit)
	}
	again := ""
	if d.Outcome == throttle.Rebooked {
		again = " again"
	}
	fmt.Fprintf(c.out, "%7.2fs  booked%s %-18s #%d for %6.2fs by %s, %d ahead\n",
		time.Since(c.start).Seconds(), again, n.Recipient, demoNumber(n.Data), at.Sub(c.start).Seconds(), rule, d.Ahead)
}

// runDemo enqueues the demo's notifications, lets the worker run for d,
// printing bookings and sends, then prints each recipient's timeline.
func runDemo(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, d time.Duration, counts *sentCounts, out io.Writer, apiURL string) error {
	client := asynq.NewClientFromRedisClient(rdb)
	route := cfg.Route(config.Route{Policy: demoPolicy, Provider: demoProvider})
	fmt.Fprintf(out, "demo: %d notifications for each of %d recipients, enqueued at once; policy %s: %s per recipient; provider %s: 2/s burst 2; running %s\n\n",
		demoEach, len(demoRecipients), demoPolicy, windowsString(demoWindows), demoProvider, d)
	counts.mu.Lock()
	counts.start, counts.out = time.Now(), out
	counts.mu.Unlock()
	for i := 1; i <= demoEach; i++ {
		for _, r := range demoRecipients {
			n := message.Notification{Recipient: r, Policy: route.Policy, Provider: route.Provider,
				Template: "weekly-digest", Data: []byte(fmt.Sprintf(`{"n":%d}`, i))}
			id := message.TaskID("")
			task, err := message.NewTask(n, id, asynq.Queue(asynqdb.ShardOf(route.Queue, id, cfg.Redis.Shards)))
			if err != nil {
				return err
			}
			if _, err := client.EnqueueContext(ctx, task); err != nil {
				return fmt.Errorf("demo: enqueue: %w", err)
			}
		}
	}
	var scheduled string // the API's message: scheduled, its events shown at the end
	if apiURL != "" {
		var err error
		if scheduled, err = demoCurl(ctx, apiURL, demoLead(d), counts.start, out); err != nil {
			return err
		}
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	counts.mu.Lock()
	defer counts.mu.Unlock()
	counts.out = nil
	fmt.Fprintf(out, "\nEach recipient's sends (seconds from the start, as they arrived; counted in a window\nwhen less than its length less %s apart). Policy %s allows %s:\n", demoJitter, demoPolicy, windowsString(demoWindows))
	for _, r := range demoRecipients {
		sends := counts.sent[r]
		var b strings.Builder
		for _, s := range sends {
			fmt.Fprintf(&b, " %5.1f", s.Sub(counts.start).Seconds())
		}
		fmt.Fprintf(out, "  %-18s %d of %d sent:%s\n", r, len(sends), demoEach, b.String())
		for _, w := range demoWindows {
			most, closest := demoWindowCheck(sends, w)
			fmt.Fprintf(out, "  %-18s   at most %d in any %s (allowed %d)%s\n", "", most, timefmt.Duration(w.Per), w.Limit, closest)
		}
	}
	fmt.Fprintf(out, "\nWithout booking, each throttled message would wake with the others and be deferred again;\n"+
		"here each was deferred once, to the moment it booked (worker.book in config.yaml).\n")
	counts.callbacks.summary(out, scheduled, counts.start)
	return nil
}

// demoJitter is what a send's arrival, timed here, may lag its moment by
// (a timer's wake-up, the provider call): two sends are counted in one
// window only when they arrived closer than its length less this.
const demoJitter = 50 * time.Millisecond

// demoWindowCheck returns the most sends in any window of w.Per (see
// demoJitter) and, for a limit of 1, the closest two sends.
func demoWindowCheck(sends []time.Time, w throttle.Window) (int, string) {
	ts := slices.SortedFunc(slices.Values(sends), time.Time.Compare)
	most := 0
	for i := range ts {
		n := 0
		for j := i; j < len(ts) && ts[j].Sub(ts[i]) < w.Per-demoJitter; j++ {
			n++
		}
		most = max(most, n)
	}
	closest := ""
	if w.Limit == 1 && len(ts) > 1 {
		c := ts[1].Sub(ts[0])
		for i := 2; i < len(ts); i++ {
			c = min(c, ts[i].Sub(ts[i-1]))
		}
		closest = fmt.Sprintf(", closest two %.2fs apart", c.Seconds())
	}
	return most, closest
}

func windowsString(ws []throttle.Window) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = w.String()
	}
	return strings.Join(parts, " and ")
}
