package dashboard

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/throttle"
)

// fixture is an engine and the dashboard's reads on one Redis, with the
// policy marketing (1 per 24h, 3 per 168h) and the provider sms (10/s,
// burst 5).
type fixture struct {
	rdb       redis.UniversalClient
	lim       *throttle.Limiter
	in        *live
	marketing *throttle.Quota
	sms       *throttle.Bucket
}

func newFixture(t *testing.T, rdb redis.UniversalClient) *fixture {
	t.Helper()
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{rdb: rdb, lim: lim}
	wins := []throttle.Window{{Limit: 1, Per: 24 * time.Hour}, {Limit: 3, Per: 168 * time.Hour}}
	if f.marketing, err = throttle.NewQuota("marketing", wins...); err != nil {
		t.Fatal(err)
	}
	if f.sms, err = throttle.NewBucket("sms", 10, 5); err != nil {
		t.Fatal(err)
	}
	f.in = liveOf(t, rdb, `
policies: {marketing: [{limit: 1, per: 24h}, {limit: 3, per: 168h}]}
providers: {sms: {type: log, rate: 10, burst: 5}}`)
	return f
}

// liveOf returns the reads of a config of policies and providers on rdb,
// without the window margin the tests' engines do not have.
func liveOf(t *testing.T, rdb redis.UniversalClient, yaml string) *live {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte("worker: {window_margin: 0s}\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	return newLive(rdb, cfg)
}

// standalone returns a client on a fresh database of the shared server.
func standalone(t *testing.T) redis.UniversalClient {
	t.Helper()
	c, _ := shared.NewClient(t)
	return c
}

func (f *fixture) admit(t *testing.T, id, recipient string, maxWait time.Duration) throttle.Decision {
	t.Helper()
	d, err := f.lim.Admit(context.Background(), throttle.Request{ID: id, MaxWait: maxWait, Takes: []throttle.Take{
		{Rule: f.marketing, Subject: recipient}, {Rule: f.sms, Subject: "sms"}}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestKeysMatchEngine admits through the engine with subjects that need
// encoding and finds its keys where keyspace says they are.
func TestKeysMatchEngine(t *testing.T) {
	f := newFixture(t, standalone(t))
	ctx := context.Background()
	for i, r := range []string{"alice@example.com", "x}:q:marketing", "{bob} 100%", "é", strings.Repeat("long", 40)} {
		f.admit(t, fmt.Sprintf("task-%d", i), r, 0)
		f.lim.Sent(f.sms, "sms", 1)
		f.writeSends()
		for _, key := range []string{quotaKey(throttle.DefaultPrefix, r, "marketing"), sentKey(throttle.DefaultPrefix, "sms"), slotsKey(throttle.DefaultPrefix, "sms")} {
			if n, err := f.rdb.Exists(ctx, key).Result(); err != nil || n != 1 {
				t.Errorf("recipient %q: key %q: EXISTS = %d, %v; want 1", r, key, n, err)
			}
		}
	}
}

// TestRecipientAgreesWithEngine checks a throttled recipient's windows and
// next moment against the engine's own decision for it.
func TestRecipientAgreesWithEngine(t *testing.T) {
	for _, tc := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"single node", func(t *testing.T) redis.UniversalClient { return standalone(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3, 0).Client(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.rdb(t))
			ctx := context.Background()
			if d := f.admit(t, "first", "alice", 0); !d.Allowed() {
				t.Fatalf("first admission denied: %+v", d)
			}
			denied := f.admit(t, "second", "alice", 0)
			if denied.Allowed() {
				t.Fatal("second admission allowed: want the 1/24h window to deny it")
			}
			st, err := f.in.readRecipient(ctx, "alice", 0, 10, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Policies) != 1 {
				t.Fatalf("policies = %d, want 1", len(st.Policies))
			}
			p := st.Policies[0]
			if !p.Next.Equal(denied.At()) {
				t.Errorf("next = %s, want the engine's %s", p.Next, denied.At())
			}
			if p.DecidedBy != 0 {
				t.Errorf("decided by window %d, want 0 (1 per 24h)", p.DecidedBy)
			}
			if fmt.Sprint(p.Used) != "[1 1]" || p.Total != 1 {
				t.Errorf("used = %v, total %d; want [1 1], 1", p.Used, p.Total)
			}
			if len(p.Entries) != 1 || p.Entries[0].Task != "first" {
				t.Fatalf("entries = %+v, want the first task's", p.Entries)
			}
			e := p.Entries[0]
			if !e.Frees[0].Equal(e.At.Add(24*time.Hour)) || !e.Frees[1].Equal(e.At.Add(168*time.Hour)) || !p.Frees[0].Equal(p.Next) {
				t.Errorf("frees: entry %v at %s, window %v", e.Frees, e.At, p.Frees)
			}
			if !p.Frees[1].IsZero() {
				t.Errorf("the 3/168h window is not full, yet frees at %s", p.Frees[1])
			}
		})
	}
}

// TestUnknownRecipientHasEmptyHistory: nothing in Redis is not an error.
func TestUnknownRecipientHasEmptyHistory(t *testing.T) {
	f := newFixture(t, standalone(t))
	st, err := f.in.readRecipient(context.Background(), "nobody@example.com", 0, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	p := st.Policies[0]
	if p.Total != 0 || len(p.Entries) != 0 || p.DecidedBy != -1 || !p.Next.Equal(st.Now) || st.Bookings.Held != 0 {
		t.Errorf("unknown recipient: %+v", st)
	}
}

// TestRecipientEntriesPaginate pages through a transactional recipient's
// entries newest first.
func TestRecipientEntriesPaginate(t *testing.T) {
	rdb := standalone(t)
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("transactional", throttle.Window{Limit: 20, Per: time.Hour})
	ctx := context.Background()
	for i := 0; i < 7; i++ {
		if d, err := lim.Admit(ctx, throttle.Request{ID: fmt.Sprintf("t%d", i), Takes: []throttle.Take{{Rule: q, Subject: "bob"}}}); err != nil || !d.Allowed() {
			t.Fatalf("admit %d: %+v, %v", i, d, err)
		}
	}
	in := liveOf(t, rdb, "policies: {transactional: [{limit: 20, per: 1h}]}")
	var seen []string
	for offset := 0; ; offset += 3 {
		st, err := in.readRecipient(ctx, "bob", offset, 3, 0)
		if err != nil {
			t.Fatal(err)
		}
		p := st.Policies[0]
		if p.Total != 7 {
			t.Fatalf("total = %d, want 7", p.Total)
		}
		if len(p.Entries) == 0 {
			break
		}
		for _, e := range p.Entries {
			seen = append(seen, e.Task)
		}
	}
	// Admissions in one call of a test may share a µs; the order among equal
	// scores is Redis's, so compare the set and the count.
	if len(seen) != 7 || !strings.Contains(strings.Join(seen, ","), "t6") {
		t.Errorf("pages gave %v, want the 7 tasks once", seen)
	}
}

// TestProviderState checks tokens, sends, the pause and what is booked.
func TestProviderState(t *testing.T) {
	f := newFixture(t, standalone(t))
	ctx := context.Background()
	fresh, err := f.in.readProviders(ctx, 0, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != 1 || fresh[0].Tokens != 5 || fresh[0].Bookings.Held != 0 || !fresh[0].PausedUntil.IsZero() {
		t.Fatalf("an untouched bucket: %+v; want full, nothing booked, not paused", fresh)
	}
	for i := 0; i < 5; i++ {
		f.admit(t, fmt.Sprintf("r%d", i), fmt.Sprintf("r%d", i), 0)
		f.lim.Sent(f.sms, "sms", 1) // what the worker counts once it sent
	}
	f.writeSends()
	st, _ := f.in.readProviders(ctx, 0, 10, 10)
	p := st[0]
	if p.Tokens < 0 || p.Tokens > 1 {
		t.Errorf("tokens = %v after 5 takes of a burst of 5, want below 1", p.Tokens)
	}
	if got := p.Sends[len(p.Sends)-1]; got != 5 {
		t.Errorf("sends in the last bin = %d, want 5 (%v)", got, p.Sends)
	}
	if p.Bookings.Held != 0 || p.Bookings.Ahead != 0 {
		t.Errorf("nothing reserved ahead, yet bookings %+v", p.Bookings)
	}

	// A take that waits for its token reserves it ahead: that is what the
	// keys hold ahead of now today.
	d := f.admit(t, "ahead", "r-ahead", time.Second)
	if !d.Allowed() || d.Delay <= 0 {
		t.Fatalf("a reservation: %+v, want allowed with a wait", d)
	}
	st, _ = f.in.readProviders(ctx, 0, 10, 10)
	b := st[0].Bookings
	if b.Held != 1 || len(b.Tasks) != 1 || b.Tasks[0].Task != "ahead" || b.Ahead <= 0 || b.Ahead > time.Second.Microseconds() {
		t.Errorf("bookings after a reservation = %+v, want the one task, under 1s ahead", b)
	}

	if _, err := f.lim.Pause(ctx, f.sms, "sms", time.Minute); err != nil {
		t.Fatal(err)
	}
	st, _ = f.in.readProviders(ctx, 0, 10, 10)
	p = st[0]
	if left := p.PausedUntil.Sub(p.Now); left < 59*time.Second || left > time.Minute {
		t.Errorf("paused until %s at %s, want a minute on", p.PausedUntil, p.Now)
	}
	// The pause takes back the slot claimed ahead inside it (its task finds
	// out by HasSlot and is admitted again), and is no booking itself.
	if p.Bookings.Held != 0 || len(p.Bookings.Tasks) != 0 {
		t.Errorf("bookings during the pause = %+v, want none: the reservation taken back, the pause not counted", p.Bookings)
	}
	// Sends are what workers sent, not takes: the reservation is none.
	if n := sum(p.Sends); n != 5 {
		t.Errorf("sends = %v, want the 5 sent", p.Sends)
	}
}

// writeSends writes the counts of f.lim.Sent, as a worker's CountSends does
// once a second and when it stops.
func (f *fixture) writeSends() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.lim.CountSends(ctx)
}

func sum(s []int64) (n int64) {
	for _, v := range s {
		n += v
	}
	return n
}

// TestBookings: tasks that book on a busy provider and a recipient at its
// cap show as bookings held, as far ahead as the engine booked them, and
// a recipient's next moment counts its bookings.
func TestBookings(t *testing.T) {
	f := newFixture(t, standalone(t))
	ctx := context.Background()
	book := func(id, recipient string) throttle.Decision {
		t.Helper()
		d, err := f.lim.Book(ctx, throttle.Request{ID: id, Takes: []throttle.Take{
			{Rule: f.marketing, Subject: recipient}, {Rule: f.sms, Subject: "sms"}}}, throttle.Booking{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The bucket's burst of 5 goes to five recipients; the next three book.
	for i := 0; i < 5; i++ {
		if d := book(fmt.Sprintf("now-%d", i), fmt.Sprintf("r%d", i)); !d.Allowed() {
			t.Fatalf("admission %d: %+v", i, d)
		}
	}
	var last throttle.Decision
	for i := 0; i < 3; i++ {
		if last = book(fmt.Sprintf("booked-%d", i), fmt.Sprintf("b%d", i)); !last.Booked() {
			t.Fatalf("booking %d: %+v, want booked", i, last)
		}
	}
	st, err := f.in.readProviders(ctx, 0, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	b := st[0].Bookings
	if b.Held != 3 || len(b.Tasks) != 2 || b.Tasks[0].Task != "booked-0" {
		t.Errorf("provider bookings = %+v, want 3 held, the first two listed", b)
	}
	if ahead := st[0].Now.Add(time.Duration(b.Ahead) * time.Microsecond); ahead.Before(last.At()) {
		t.Errorf("booked ahead until %s, before the last booking's %s", ahead, last.At())
	}

	// A recipient at its cap books its next message a day on.
	d := book("b0-again", "b0")
	if !d.Booked() {
		t.Fatalf("b0's second message: %+v, want booked", d)
	}
	rs, err := f.in.readRecipient(ctx, "b0", 0, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Bookings.Held != 2 || !fromUS(rs.Bookings.Tasks[1].At).Equal(d.At()) {
		t.Errorf("b0's bookings = %+v, want its 2 bookings, the second at %s", rs.Bookings, d.At())
	}
	if p := rs.Policies[0]; p.Ahead < 1 || p.Used[1]+p.Ahead != 2 {
		t.Errorf("b0's entries: %v up to now and %d ahead, want its 2 with the booked one ahead", p.Used, p.Ahead)
	}
	// A third message fits the 1/24h window a day after the second one.
	if p := rs.Policies[0]; p.DecidedBy != 0 || !p.Next.Equal(d.At().Add(24*time.Hour)) {
		t.Errorf("b0's next = %s by window %d, want a day after its last booking %s, by 1 per 24h", p.Next, p.DecidedBy, d.At())
	}
}
