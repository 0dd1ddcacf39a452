package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// TestDifferential replays random admissions and releases against a real
// redis-server through the Limiter and against model, and requires the same
// outcome from both. The model is run at the time Redis used (Decision.Now,
// the release's TIME), so both sides compute from the same µs and must agree
// exactly, Delay included: a 1ms slack would hide µs slips such as a floor
// for a ceil in a reservation or an off-by-one window end (both tried).
//
// The operations are split among walks that run side by side (3 of 1000
// operations each by default), each on a database of its own with rules,
// a Remember and a seed of its own. A walk's clock is real time (pause and
// the retries' sleeps), so three walks side by side make the checks of one
// walk three times as long in a third of the time. Each still lasts about
// ten seconds, many times the longest window and Remember, and its rules
// change several times. The checks that the run tested calendar windows,
// quiet hours, gates and places in line count the walks together.
//
// Now and then the walk also runs a mover (differential_movers_test.go):
// a bucket's rate changes and Repace moves its waiting work, a tenant's
// weight changes and Reweigh moves the lines, or Pause pauses a bucket.
// Each is held to the model of lua/repace.lua and pause.lua the same way,
// and a default run must have moved work with each.
//
// The seed is logged; THROTTLE_DIFF_SEED=<seed> replays the same operations
// and sleeps (Redis's clock, and so the outcomes, still differ from run to
// run): walk i's seed is seed+i, so THROTTLE_DIFF_SEED=<seed+i>
// THROTTLE_DIFF_WALKS=1 replays walk i alone. THROTTLE_DIFF_OPS=<n> sets
// how many operations a walk makes, THROTTLE_DIFF_WALKS=<n> how many walks,
// and THROTTLE_DIFF_SCRIPTS=1 runs the Lua as scripts rather than functions.
//
// Expiry boundary: Redis drops a key once its ms clock is past the PEXPIRE
// deadline (now > when, db.c keyIsExpired), not at it; the model does the
// same. The ms clocks Redis uses (script start, PEXPIRE time) are a few µs
// from TIME, so a key expiring in exactly the ms that TIME crosses could be
// judged differently. That is invisible but for a shortened key (below):
// every other key expires only after all in it has stopped counting anyway
// (a full bucket, entries out of every window), which is also why judging
// expiry with >= instead of > passes here just as well.
//
// No key may expire while an entry in it still counts: the model counts any
// such loss (model.lost) and the test fails on it. (It once happened: a plain
// admission set the quota's PEXPIRE from its own moment and cut short an
// entry reserved further ahead; rules.lua's extend now only lengthens.)
func TestDifferential(t *testing.T) {
	t.Parallel()
	seed := diffEnv(t, "THROTTLE_DIFF_SEED", rand.Uint64())
	walks := int(diffEnv(t, "THROTTLE_DIFF_WALKS", 3))
	ops := 1000
	if testing.Short() {
		ops = 170
	}
	ops = int(diffEnv(t, "THROTTLE_DIFF_OPS", uint64(ops)))
	t.Logf("seed %d (rerun with THROTTLE_DIFF_SEED=%d), %d walks of %d ops", seed, seed, walks, ops)

	ds := make([]*differ, walks)
	t.Run("walks", func(t *testing.T) {
		for i := range walks {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				ds[i] = diffWalk(t, seed+uint64(i), ops)
			})
		}
	})
	if t.Failed() {
		return
	}
	var byCalendar, byQuiet [2]int
	var gated, placed, countOnly, checks int
	for _, d := range ds {
		for k := range 2 {
			byCalendar[k] += d.stats.byCalendar[k]
			byQuiet[k] += d.stats.byQuiet[k]
		}
		gated += d.m.fair["gated"]
		placed += d.stats.queued + d.m.fair["expired in place"]
		countOnly += d.stats.countOnly
		checks += d.stats.checks
	}
	if total := walks * ops; total >= 1000 {
		if byCalendar[0] == 0 || byCalendar[1] == 0 || byQuiet[0] == 0 || byQuiet[1] == 0 {
			t.Errorf("calendar windows or quiet hours never bound a denial and a booking: the run did not test them")
		}
		if gated == 0 || placed == 0 {
			// (Line ends and returners come up in most runs, not all: the
			// tests in fair_model_test.go cover them whatever the seed.)
			t.Errorf("gates or places in line never came up: the run did not test them")
		}
		if countOnly == 0 || checks == 0 {
			t.Errorf("%d count-only takes, %d checks: the run did not test them", countOnly, checks)
		}
	}
	if total := walks * ops; total >= 3000 { // a default run's: about ten of each
		checkMovers(t, ds)
	}
}

// diffWalk makes one walk of ops random operations from seed, comparing
// each outcome with the model's, and logs what it did.
func diffWalk(t *testing.T, seed uint64, ops int) *differ {
	t.Logf("seed %d (rerun this walk alone with THROTTLE_DIFF_SEED=%d THROTTLE_DIFF_WALKS=1)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	// At least 1s (Options' minimum) and short enough that ledgers forget IDs
	// within a run.
	remember := time.Second + time.Duration(rng.Int64N(int64(time.Second)))
	d := newDiffer(t, rng, seed, remember)
	for _, tn := range d.tenants {
		d.weights[tn] = d.rng.IntN(4) // 0: the default, 1
	}
	d.rules = []Rule{d.newQuota("q1"), d.newQuota("q2"), d.newBucket("b1"), d.newBucket("b2"), d.newSlowBucket("b3"),
		d.newCalendar("c1"), d.newQuiet("h1")}
	for _, r := range d.rules {
		t.Logf("%s %s: %s", kindName(r), r.Name(), r)
	}
	t.Logf("remember %s", remember)

	start := time.Now()
	d.repaceAll(0)
	var retry *Request
	for op := 0; op < ops; op++ {
		d.change(op, retry == nil)
		if r, ok := d.due(); ok && d.rng.IntN(4) > 0 {
			d.last[r.ID] = r
			d.admit(op, r)
			d.pause()
			continue
		}
		switch p := d.rng.Float64(); {
		case retry != nil:
			// Retried once the denial's delay has passed: just after a window
			// edge or the moment the tokens are there.
			d.admit(op, *retry)
			retry = nil
		case p < 0.10 && len(d.ids) > 0:
			d.release(op, d.releasable(d.earlierID(0.8)))
		case p < 0.13:
			d.check(op, d.request())
		case p < 0.17:
			// A few at once, with no time between them.
			for range 2 + d.rng.IntN(3) {
				d.admit(op, d.request())
			}
		default:
			r := d.request()
			if dec := d.admit(op, r); !dec.Allowed() && dec.Delay <= 150*time.Millisecond && d.rng.IntN(10) == 0 {
				d.stats.retries++
				time.Sleep(dec.Delay) // time under test: a retry after the delay the engine gave
				retry = &r
				continue
			}
		}
		d.pause()
	}

	s := d.stats
	t.Logf("calendar windows set %d delays and %d booked moments, quiet hours %d and %d", s.byCalendar[0], s.byCalendar[1], s.byQuiet[0], s.byQuiet[1])
	t.Logf("bookings: %d booked (%d again, after a missed moment), %d claimed, %d expired", s.booked, s.rebooked, s.claimed, s.expired)
	f := d.m.fair
	t.Logf("fair shares: %d bookings of a tenant held by its gate, %d placed in line; %d new tasks sent to their line's end, %d back from a place and placed again, "+
		"%d back early whose place stood, %d back from a place that went or took a slot (%d of them booking it), %d expired at their place; %d weight changes; "+
		"%d places held to their share's stride, %d of them with other tenants waiting",
		f["gated"], s.queued, f["line end"], f["placed again"], f["stands"], s.returned, f["returned"], f["expired in place"], s.weightChanges,
		s.shareChecks, s.sharedChecks)
	t.Logf("%d ops in %s: %d admissions, %d allowed (%d reserved ahead, %d repeated), %d denied (%d checked for no trace); "+
		"%d releases undid %d takes (%d undid nothing); %d rule changes, %d retries at the delay; "+
		"%d key deadlines later in Redis than in the model (by up to %dms), %d keys Redis kept at their deadline's ms",
		ops, time.Since(start).Round(time.Millisecond), s.admits, s.allowed, s.reserved, s.repeated,
		s.denied, s.noTrace, s.releases, s.releasedTakes, s.emptyReleases, s.ruleChanges, s.retries, s.expiryLater, s.expiryDelta, s.adopted)
	d.logMovers()
	if d.m.lost["q"]+d.m.lost["s"] > 0 {
		t.Errorf("entries lost to a shortened expiry while they still counted: %d quota, %d slot calendar or ledger (seed %d)", d.m.lost["q"], d.m.lost["s"], seed)
	}
	if d.m.lost["w"]+d.m.lost["t"] > 0 {
		t.Errorf("tenants still waiting lost as their keys expired: %d records, %d expiries (seed %d)", d.m.lost["w"], d.m.lost["t"], seed)
	}
	return d
}

// newDiffer returns a differ on a fresh client of the shared server.
func newDiffer(t *testing.T, rng *rand.Rand, seed uint64, remember time.Duration) *differ {
	t.Helper()
	rdb, _ := shared.NewClient(t)
	l, err := New(rdb, Options{Remember: remember})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("THROTTLE_DIFF_SCRIPTS") == "1" {
		l.noFunctions.Store(true) // the scripts, as servers without functions run them
		t.Logf("as scripts (EVALSHA)")
	}
	return &differ{
		t: t, rng: rng, seed: seed, l: l, rdb: rdb, m: newModel(), remember: remember,
		recipients: []string{"alice", "bob@example.com", "+15550100", "carol{x}", "dave:1", "éva"},
		providers:  []string{"sms-gw", "mail gw"},
		tenants:    []string{"", "acme", "béta co", "a,b"}, // "" the default; a comma in the name, after the three the argument splits on
		weights:    map[string]int{},
		aheads:     map[string]time.Duration{},
		last:       map[string]Request{},
		took:       map[string]Request{},
	}
}

// differ drives one differential run.
type differ struct {
	t        *testing.T
	rng      *rand.Rand
	seed     uint64
	l        *Limiter
	rdb      *redis.Client
	m        *model
	remember time.Duration

	recipients, providers []string
	tenants               []string
	weights               map[string]int           // each tenant's weight, changed now and then
	aheads                map[string]time.Duration // horizons, by bucket, subject and limits (see horizonOf)
	targeted              bool                     // a targeted test's
	rules                 []Rule                   // q1 q2 b1 b2 b3 f1 c1 h1, replaced now and then
	ids                   []string                 // task IDs in order of first use
	admitted              []string                 // IDs as they were allowed (with repeats)
	last                  map[string]Request       // each ID's latest request
	took                  map[string]Request       // each ID's latest request that took something
	history               []string                 // the latest operations, for failure messages
	inv                   invariantState           // see invariants
	mv                    movers                   // see differential_movers_test.go
	// claims are booked tasks that will come back, by when (sorted): at
	// their moment, a little early or late.
	claims []claim
	stats  struct {
		admits, allowed, reserved, repeated, denied int
		releases, releasedTakes, emptyReleases      int
		ruleChanges, retries                        int
		booked, rebooked, claimed, expired          int
		expiryLater                                 int // key deadlines Redis set later than the model (see checkState)
		adopted                                     int // keys Redis kept that the model let expire at their deadline's ms (see checkState)
		expiryDelta                                 int64
		byCalendar, byQuiet                         [2]int // decisions whose moment they set: [0] denied, [1] booked
		countOnly                                   int    // count-only takes asked for
		checks                                      int    // Limiter.Check calls
		queued, returned, weightChanges             int    // the rest of fair shares' counts are model.fair
		shareChecks, sharedChecks                   int    // places checked for their share's stride; with others waiting
		noTrace                                     int    // denials checked for writes
	}
}

type claim struct {
	r  Request
	at time.Time
}

// expect schedules a booked task's return: most come back within their max
// wait before the moment (as a worker does), some early (told the moment
// again), some late (they go, or book again); a fifth never come back. Most
// of those placed in line come back at their place.
func (d *differ) expect(r Request, dec Decision) {
	if d.rng.IntN(5) == 0 || dec.At().Sub(dec.Now) > 3*time.Second {
		return
	}
	at := dec.At()
	if dec.Outcome == Placed { // its caller keeps that it is in line
		b := *r.book
		b.Back, r.book = true, &b
	}
	switch p := d.rng.IntN(10); {
	case dec.Outcome == Placed && p < 7: // asynq runs it again at its place
		at = at.Add(d.between(0, 20*time.Millisecond))
	case p < 6:
		at = at.Add(-d.between(0, r.MaxWait))
	case p < 8:
		at = at.Add(-d.between(r.MaxWait, r.MaxWait+200*time.Millisecond))
	default:
		at = at.Add(d.between(0, 300*time.Millisecond))
	}
	i, _ := slices.BinarySearchFunc(d.claims, at, func(c claim, t time.Time) int { return c.at.Compare(t) })
	d.claims = slices.Insert(d.claims, i, claim{r, at})
}

// due returns a claim whose time has come (by this process's clock, which
// is Redis's host clock here), if any.
func (d *differ) due() (Request, bool) {
	if len(d.claims) == 0 || time.Now().Before(d.claims[0].at) {
		return Request{}, false
	}
	c := d.claims[0]
	d.claims = d.claims[1:]
	return c.r, true
}

func diffEnv(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}

func (d *differ) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(d.rng.Int64N(int64(hi-lo)+1))
}

func (d *differ) newQuota(name string) *Quota {
	ws := make([]Window, 1+d.rng.IntN(3))
	for i := range ws {
		ws[i] = Window{Limit: 1 + d.rng.IntN(5), Per: d.between(20*time.Millisecond, 1500*time.Millisecond).Truncate(time.Microsecond)}
	}
	return mustQuota(d.t, name, ws...)
}

func (d *differ) newBucket(name string) *Bucket {
	rate := math.Exp(math.Log(0.5) + d.rng.Float64()*math.Log(10000)) // 0.5 to 5000, any float
	if d.rng.IntN(2) == 0 {
		rates := []float64{0.5, 1, 2.5, 7.5, 33.3, 100, 1000, 5000}
		rate = rates[d.rng.IntN(len(rates))]
	}
	b := mustBucket(d.t, name, rate, 1+d.rng.IntN(20))
	if n := d.rng.IntN(b.Burst()); d.rng.IntN(2) == 0 && n > 0 {
		var err error
		if b, err = b.WithReserve(n); err != nil {
			d.t.Fatal(err)
		}
	}
	return b
}

// newSlowBucket returns a bucket of 2 to 50 slots a second, burst 1 to 3:
// one that a few bookings fill past a horizon, so that lines form in every
// run whatever the other buckets' rates.
func (d *differ) newSlowBucket(name string) *Bucket {
	return mustBucket(d.t, name, 2+d.rng.Float64()*48, 1+d.rng.IntN(3))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// maxCost is the most a random take of rule costs: its MaxCost, but a few
// for quiet hours, which cost nothing whatever the cost.
func (d *differ) maxCost(rule Rule) int {
	if _, ok := rule.(*Quiet); ok {
		return 3
	}
	return rule.MaxCost()
}

// newCalendar returns a calendar quota whose windows, from 100ms to 1.5s
// long, cover the next few minutes (and an hour before and after).
func (d *differ) newCalendar(name string) *CalendarWindow {
	now := time.Now().Truncate(time.Microsecond)
	bs := []time.Time{now.Add(-time.Hour)}
	for at := now.Add(-d.between(0, time.Second)); at.Before(now.Add(5 * time.Minute)); at = at.Add(d.between(100*time.Millisecond, 1500*time.Millisecond)) {
		bs = append(bs, at)
	}
	bs = append(bs, now.Add(time.Hour))
	c, err := NewCalendarWindow(name, 1+d.rng.IntN(5), bs...)
	if err != nil {
		d.t.Fatal(err)
	}
	return c
}

// newQuiet returns quiet hours of spans from 20ms to 400ms, 100ms to 2s
// apart, over the next few minutes.
func (d *differ) newQuiet(name string) *Quiet {
	now := time.Now().Truncate(time.Microsecond)
	var spans []Span
	for at := now.Add(-d.between(0, time.Second)); at.Before(now.Add(5 * time.Minute)); {
		end := at.Add(d.between(20*time.Millisecond, 400*time.Millisecond))
		spans = append(spans, Span{at, end})
		at = end.Add(d.between(100*time.Millisecond, 2*time.Second))
	}
	q, err := NewQuiet(name, now.Add(-time.Hour), now.Add(time.Hour), spans...)
	if err != nil {
		d.t.Fatal(err)
	}
	return q
}

// changeRule replaces a rule by one of the same kind and name with new
// limits: the history in Redis must be judged by the new ones at once.
// Earlier requests repeated later still carry the old rule.
func (d *differ) changeRule() {
	i := d.rng.IntN(len(d.rules))
	switch r := d.rules[i].(type) {
	case *Quota:
		d.rules[i] = d.newQuota(r.Name())
	case *Bucket:
		d.rules[i] = d.newBucket(r.Name())
		if r.Name() == "b3" {
			d.rules[i] = d.newSlowBucket(r.Name())
		}
	case *CalendarWindow:
		d.rules[i] = d.newCalendar(r.Name())
	case *Quiet:
		d.rules[i] = d.newQuiet(r.Name())
	}
	d.stats.ruleChanges++
	d.inv.init()
	d.inv.changed[d.rules[i].Name()] = true
	d.note(fmt.Sprintf("rule %s is now %s", d.rules[i].Name(), d.rules[i]))
}

// earlierID picks a used task ID, mostly a recent one, with probability
// admitted one whose latest admission was allowed (what a worker releases or
// gets redelivered).
func (d *differ) earlierID(admitted float64) string {
	ids := d.ids
	if len(d.admitted) > 0 && d.rng.Float64() < admitted {
		ids = d.admitted
	}
	if n := len(ids); n > 20 && d.rng.IntN(10) < 7 {
		return ids[n-1-d.rng.IntN(20)]
	}
	return ids[d.rng.IntN(len(ids))]
}

func (d *differ) newID() string {
	n := len(d.ids)
	id := fmt.Sprintf("task-%d", n)
	switch n % 7 {
	case 3:
		id = fmt.Sprintf("tâche %d", n) // UTF-8 and a space
	case 5:
		id = fmt.Sprintf("w:{%d}", n) // what a key or a hash field could trip over
	}
	d.ids = append(d.ids, id)
	return id
}

func (d *differ) maxWait() time.Duration {
	if d.rng.IntN(2) == 0 {
		return 0
	}
	return d.between(time.Microsecond, 300*time.Millisecond) // ns: the engine sends whole µs
}

// releasable is what a caller gives back for task id: the request that
// took what it holds (Release's contract: a bucket's slot is given back by
// its length at the request's cost), else its latest.
func (d *differ) releasable(id string) Request {
	if r, ok := d.took[id]; ok {
		return r
	}
	return d.last[id]
}

// request returns a new task, the same task again (a redelivery), or an
// earlier ID with other takes (some of which it may already hold), and
// records it as its ID's latest.
func (d *differ) request() Request {
	r := d.pick()
	d.last[r.ID] = r
	return r
}

func (d *differ) pick() Request {
	if len(d.ids) > 0 && d.rng.IntN(100) < 15 {
		id := d.earlierID(0.5)
		if d.rng.IntN(5) > 0 {
			r := d.last[id]
			if d.rng.IntN(5) == 0 {
				r.MaxWait = d.maxWait()
			}
			return r
		}
		return d.newRequest(id)
	}
	return d.newRequest(d.newID())
}

func (d *differ) newRequest(id string) Request {
	r := Request{ID: id, MaxWait: d.maxWait()}
	if d.rng.IntN(2) == 0 {
		return d.newBooking(r)
	}
	type use struct{ rule, key string }
	used := map[use]bool{}
	for n := 1 + d.rng.IntN(3); len(r.Takes) < n; {
		rule := d.rules[d.rng.IntN(len(d.rules))]
		key := d.recipients[d.rng.IntN(len(d.recipients))]
		if _, ok := rule.(*Bucket); ok {
			key = d.providers[d.rng.IntN(len(d.providers))]
		}
		if used[use{rule.Name(), key}] {
			continue
		}
		used[use{rule.Name(), key}] = true
		cost := 0 // the default, 1
		if d.rng.IntN(5) < 2 {
			cost = 1 + d.rng.IntN(d.maxCost(rule))
		}
		r.Takes = append(r.Takes, Take{Rule: rule, Subject: key, Cost: cost, CountOnly: d.countOnly(rule)})
	}
	return r
}

// countOnly picks, now and then, a quota or calendar take that counts
// only (Take.CountOnly).
func (d *differ) countOnly(rule Rule) bool {
	if k := rule.kind(); (k == "q" || k == "c") && d.rng.IntN(5) == 0 {
		d.stats.countOnly++
		return true
	}
	return false
}

// newBooking fills r with a booking request: quotas and at most one
// bucket, now and then with priority or a deadline.
func (d *differ) newBooking(r Request) Request {
	r.book = &Booking{}
	if r.MaxWait == 0 && d.rng.IntN(5) > 0 {
		r.MaxWait = d.between(time.Millisecond, 300*time.Millisecond) // a worker's inline wait
	}
	r.book.Priority = d.rng.IntN(6) == 0
	if d.rng.IntN(4) == 0 {
		r.book.Deadline = time.Now().Add(d.between(0, 2*time.Second)).Truncate(time.Microsecond)
	}
	type use struct{ rule, key string }
	used := map[use]bool{}
	buckets := 0
	for n := 1 + d.rng.IntN(3); len(r.Takes) < n; {
		rule := d.rules[d.rng.IntN(len(d.rules))]
		key := d.recipients[d.rng.IntN(len(d.recipients))]
		if _, ok := rule.(*Bucket); ok {
			if buckets > 0 {
				continue
			}
			key = d.providers[d.rng.IntN(len(d.providers))]
		}
		if used[use{rule.Name(), key}] {
			continue
		}
		used[use{rule.Name(), key}] = true
		if _, ok := rule.(*Bucket); ok {
			buckets++
		}
		cost := 0 // the default, 1
		if d.rng.IntN(5) < 2 {
			cost = 1 + d.rng.IntN(d.maxCost(rule))
		}
		r.Takes = append(r.Takes, Take{Rule: rule, Subject: key, Cost: cost, CountOnly: d.countOnly(rule)})
	}
	d.fairShare(&r)
	return r
}

// fairShare gives a booking request its tenant (a few, the default "" among
// them) and that tenant's weight (changed now and then: a weight changed
// while the tenant waits, which its record overrides until a reweigh or
// the wait's end), and its bucket's horizon (see horizonOf).
func (d *differ) fairShare(r *Request) {
	tn := d.tenants[d.rng.IntN(len(d.tenants))]
	if d.rng.IntN(40) == 0 {
		d.weights[tn] = d.rng.IntN(4)
		d.stats.weightChanges++
		d.note(fmt.Sprintf("tenant %q's weight is now %d", tn, d.weights[tn]))
	}
	r.book.Tenant, r.book.Weight = tn, d.weights[tn]
	if r.book.Horizon = d.horizonOf(*r); r.book.Horizon == 0 {
		return
	}
	// A third of the time, work waits behind it unseen: as a worker whose
	// queue is not empty says of every task it picks up.
	r.book.Backlog = d.rng.IntN(3) == 0
}

// horizonOf picks r's horizon. Workers share one: a bucket's tasks mostly
// ask for the same (a few slots ahead, or none, chosen per bucket and
// subject and changed with the rule), so that a line forms and its tasks
// come back to free slots; now and then one asks for another.
func (d *differ) horizonOf(r Request) time.Duration {
	for _, t := range r.Takes {
		b, ok := t.Rule.(*Bucket)
		if !ok {
			continue
		}
		if d.rng.IntN(10) == 0 {
			break
		}
		k := b.Name() + "@" + t.Subject + " " + b.String()
		if h, ok := d.aheads[k]; ok {
			return h
		}
		h := time.Duration(0)
		if d.rng.IntN(4) > 0 {
			slot := time.Duration(float64(time.Second) / b.Rate())
			h = min(max(time.Millisecond, slot*time.Duration(1+d.rng.IntN(8))), 1500*time.Millisecond).Truncate(time.Microsecond)
		}
		d.aheads[k] = h
		return h
	}
	if d.rng.IntN(2) == 0 {
		return 0
	}
	return d.between(time.Millisecond, time.Second)
}

// pause lets time pass: often a little, now and then enough for windows to
// roll over and buckets to refill. Its sleeps are the test's clock, not waits.
func (d *differ) pause() {
	switch p := d.rng.Float64(); {
	case p < 0.012:
		time.Sleep(d.between(100*time.Millisecond, 600*time.Millisecond))
	case p < 0.40:
		time.Sleep(d.between(0, 15*time.Millisecond))
	}
}

// admit admits r through the Limiter and checks the decision against the
// model's, which it returns.
func (d *differ) admit(op int, r Request) Decision {
	d.t.Helper()
	placed := horizon(r) && r.book.Back // the model notes a place in line for it
	if r.book != nil {
		d.booking(r)
	}
	before, tenants := d.dumpTakes(r), d.readTenants(r)
	got, err := d.l.Admit(d.t.Context(), r)
	if err != nil {
		d.t.Fatalf("op %d: Admit(%s): %v", op, describeRequest(r), err)
	}
	if _, held := d.took[r.ID]; got.Outcome == Denied && !held && !slices.Contains(d.admitted, r.ID) {
		d.noTrace(op, r, got, before, tenants)
	}
	want := d.m.admit(r, got.Now.UnixMicro(), d.remember.Microseconds())
	what := fmt.Sprintf("op %d: admit %s", op, describeRequest(r))
	if diff := diffDecision(want, got); diff != "" {
		d.fail(what, r, got.Now.UnixMicro(), diff)
	}
	d.note(fmt.Sprintf("%s -> %s", what, describeDecision(got)))
	if got.Allowed() {
		d.admitted = append(d.admitted, r.ID)
	}
	if got.Reserved() {
		d.took[r.ID] = r
		d.inv.took(r, d.m, d.redisKey)
	}
	if got.Booked() {
		d.expect(r, got)
	}
	if got.Outcome == Placed {
		d.placed(op, r, got)
		d.inLine(r, got)
	}
	if placed && (got.Allowed() || got.Booked() && got.Outcome != Placed) {
		d.stats.returned++
	}
	d.count(got)
	d.checkState(op, r)
	d.invariants(op, r)
	return got
}

// check runs Limiter.Check on r: the model's decision, and nothing written.
func (d *differ) check(op int, r Request) {
	d.t.Helper()
	got, err := d.l.Check(d.t.Context(), r)
	if err != nil {
		d.t.Fatalf("op %d: Check(%s): %v", op, describeRequest(r), err)
	}
	r.book, r.CheckDone, r.check = nil, false, true
	want := d.m.admit(r, got.Now.UnixMicro(), d.remember.Microseconds())
	what := fmt.Sprintf("op %d: check %s", op, describeRequest(r))
	if diff := diffDecision(want, got); diff != "" {
		d.fail(what, r, got.Now.UnixMicro(), diff)
	}
	d.note(fmt.Sprintf("%s -> %s", what, describeDecision(got)))
	d.stats.checks++
	d.checkState(op, r)
}

func (d *differ) count(dec Decision) {
	d.stats.admits++
	switch dec.Rule.(type) {
	case *CalendarWindow:
		d.stats.byCalendar[btoi(dec.Booked())]++
	case *Quiet:
		d.stats.byQuiet[btoi(dec.Booked())]++
	}
	switch {
	case dec.Outcome == Placed:
		d.stats.queued++
	case dec.Booked():
		d.stats.booked++
		if dec.Outcome == Rebooked {
			d.stats.rebooked++
		}
	case dec.Outcome == Expired:
		d.stats.expired++
	case !dec.Claimed.IsZero():
		d.stats.claimed++
	}
	switch {
	case !dec.Allowed():
		d.stats.denied++
	case dec.Outcome == Repeated:
		d.stats.allowed++
		d.stats.repeated++
	default:
		d.stats.allowed++
		if dec.Delay > 0 {
			d.stats.reserved++
		}
	}
}

func (d *differ) release(op int, r Request) {
	d.t.Helper()
	if d.startedBefore(r) {
		return
	}
	got, now, err := d.l.undo(d.t.Context(), r, d.l.release, "release")
	if err != nil {
		d.t.Fatalf("op %d: release %s: %v", op, describeRequest(r), err)
	}
	want := d.m.release(r, now.UnixMicro())
	what := fmt.Sprintf("op %d: release %s", op, describeRequest(r))
	if got != want {
		d.fail(what, r, now.UnixMicro(), fmt.Sprintf("\t-undone: %d\n\t+undone: %d\n", want, got))
	}
	d.note(fmt.Sprintf("%s -> %d undone at %d", what, got, now.UnixMicro()))
	d.checkState(op, r)
	d.stats.releases++
	d.stats.releasedTakes += got
	if got == 0 {
		d.stats.emptyReleases++
	}
}

// checkState requires the keys r's takes use to hold the same in Redis as
// in the model: the same members and scores, the same hash fields and
// values, exactly. (A decision can hide a difference: a take that leaves
// more than another only shows in Remaining once it is the least.) Redis is
// read a little after the operation ran, in one MULTI with its TIME, and
// keys within margin of expiring by that time are not compared.
//
// It also takes each key's expiry deadline from Redis (PEXPIRETIME). PEXPIRE
// counts from Redis's ms clock when it runs, which the model can only take
// to be the ms of the script's TIME: a script may run a PEXPIRE a ms or
// more after its TIME (tens of ms on a loaded machine that preempts Redis
// mid-script). Such a deadline is later than the model's
// by those ms (never earlier, and by at most maxLater), and the model adopts
// it, so that a later operation in that ms is judged the same on both sides.
// (It only shows after a rule change: a key expires when all in it has
// stopped counting under the rule that wrote it.) Every key must have a
// deadline.
func (d *differ) checkState(op int, r Request) {
	d.t.Helper()
	const maxLater = 1000 // ms
	// A script preempted between its TIME and a PEXPIRE ... GT can also see
	// an extension judged a few ms apart from the model's (seen: 2 to 6 ms
	// earlier, in 2 of 9 runs on a loaded machine). A wrong TTL is off by
	// far more.
	const maxEarlier = 20 // ms
	const margin = 20     // ms
	ctx := context.WithoutCancel(d.t.Context())
	var mks []modelKey
	for _, t := range d.m.parse(r) {
		if t.kind == "h" {
			continue // no key
		}
		mks = append(mks, t.key)
		if t.kind == "b" {
			mks = append(mks, t.book, t.cal, t.fair, t.tenants)
		}
	}
	type snap struct {
		when  *redis.IntCmd
		typ   *redis.StatusCmd
		zset  *redis.ZSliceCmd
		hash  *redis.MapStringStringCmd
		rkey  string
		model modelKey
	}
	snaps := make([]snap, len(mks))
	var timeCmd *redis.TimeCmd
	_, err := d.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		timeCmd = p.Time(ctx)
		for i, mk := range mks {
			rk := d.redisKey(mk)
			snaps[i] = snap{
				when: redis.NewIntCmd(ctx, "PEXPIRETIME", rk), // -2 absent, -1 no TTL
				typ:  p.Type(ctx, rk), zset: p.ZRangeWithScores(ctx, rk, 0, -1), hash: p.HGetAll(ctx, rk),
				rkey: rk, model: mk,
			}
			_ = p.Process(ctx, snaps[i].when)
		}
		return nil
	})
	if err != nil && !redis.HasErrorPrefix(err, "WRONGTYPE") {
		d.t.Fatalf("op %d: reading Redis: %v", op, err)
	}
	nowT := timeCmd.Val()
	nowMS := nowT.UnixMilli()
	for _, sn := range snaps {
		rk := sn.rkey
		e := d.m.keys[sn.model]
		when := sn.when.Val()
		if when == -1 {
			d.fail(fmt.Sprintf("op %d: %s has no TTL", op, rk), r, nowT.UnixMicro(), "")
		}
		if e != nil && when > 0 && when != e.expMS {
			if later := when - e.expMS; later < -maxEarlier || later > maxLater {
				d.fail(fmt.Sprintf("op %d: expiry of %s", op, rk), r, nowT.UnixMicro(),
					fmt.Sprintf("\t-deadline %d ms\n\t+deadline %d ms (%+d)\n", e.expMS, when, later))
			}
			d.stats.expiryLater++
			d.stats.expiryDelta = max(d.stats.expiryDelta, when-e.expMS)
			e.expMS = when
		}
		want, got, err := stateOf(sn.model, e, sn.typ.Val(), sn.zset.Val(), sn.hash.Val())
		if err != nil {
			d.t.Fatalf("%s: %v", rk, err)
		}
		if d.m.ambiguous[sn.model] && when > 0 && want != got {
			// The model let the key expire a few ms past its deadline; Redis,
			// judging by its script's start, kept it. What it kept had
			// stopped counting (keys expire only then), and the decision
			// agreed: the model takes Redis's state, to judge the next
			// operation the same.
			d.m.keys[sn.model] = adopted(sn.model, sn.zset.Val(), sn.hash.Val(), when)
			d.stats.adopted++
			continue
		}
		if e != nil && e.expMS-nowMS <= margin {
			continue // (about to be) expired in the model
		}
		if when >= 0 && when-nowMS <= margin {
			continue // about to expire in Redis
		}
		if want != got {
			d.fail(fmt.Sprintf("op %d: state of %s", op, rk), r, nowT.UnixMicro(), fmt.Sprintf("\t-%s\n\t+%s\n", want, got))
		}
	}
	clear(d.m.ambiguous)
	for i, mk := range mks {
		if e := d.m.keys[mk]; mk.kind == "w" && e != nil {
			if msg := fairWeights(e.s); msg != "" {
				d.fail(fmt.Sprintf("op %d: %s", op, snaps[i].rkey), r, nowT.UnixMicro(), msg)
			}
		}
	}
}

// stateOf returns, comparable, the model's entry e of key k and what
// Redis holds of it (its type, and its members or fields).
func stateOf(k modelKey, e *modelEntry, typ string, zs []redis.Z, h map[string]string) (want, got string, err error) {
	if k.kind == "w" { // fields hold strings
		var w map[string]string
		if e != nil {
			w = e.s
		}
		return fmt.Sprint(modelStrings(w)), fmt.Sprint(modelStrings(h)), nil
	}
	var g map[string]float64
	switch typ {
	case "zset":
		g = map[string]float64{}
		for _, z := range zs {
			g[z.Member.(string)] = z.Score
		}
	case "hash":
		g = map[string]float64{}
		for f, v := range h {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return "", "", fmt.Errorf("%s = %q: %w", f, v, err)
			}
			g[f] = x
		}
	}
	var w map[string]float64
	if e != nil {
		w = e.z
		if k.kind == "b" {
			w = e.h
		}
	}
	return fmt.Sprint(modelPairs(w)), fmt.Sprint(modelPairs(g)), nil
}

// adopted is a model entry of key k holding what Redis holds (zs or h),
// expiring at when (Unix ms).
func adopted(k modelKey, zs []redis.Z, h map[string]string, when int64) *modelEntry {
	e := &modelEntry{z: map[string]float64{}, h: map[string]float64{}, s: map[string]string{}, expMS: when}
	for _, z := range zs {
		e.z[z.Member.(string)] = z.Score
	}
	for f, v := range h {
		if k.kind == "w" {
			e.s[f] = v
		} else if x, err := strconv.ParseFloat(v, 64); err == nil {
			e.h[f] = x
		}
	}
	return e
}

// fairWeights checks what book.lua's fair shares rest on, on a bucket's
// tenants hash (as Redis holds it: the model agrees): W is the sum of the
// weights of the tenants it holds a record of (those waiting, and those that
// stopped waiting and are still to be pruned). It returns what is wrong, if
// anything.
func fairWeights(h map[string]string) string {
	sum := 0.0
	for tn, rec := range h {
		if tn != modelFairW && tn != modelFairJ && tn != modelFairP {
			_, _, w, _ := fairRecord(rec)
			sum += w
		}
	}
	if ws, ok := h[modelFairW]; ok && modelNum(ws) != sum {
		return fmt.Sprintf("W is %s, but the tenants recorded weigh %v: %v\n", ws, sum, modelStrings(h))
	}
	return ""
}

// redisKey is the Redis key of a model key.
func (d *differ) redisKey(k modelKey) string {
	tag := keyspace.Tag(DefaultPrefix, k.subject)
	switch k.kind {
	case "q":
		return keyspace.Quota(tag, k.rule)
	case "b":
		return keyspace.Bucket(tag, k.rule)
	case "k":
		return keyspace.Book(tag, k.rule)
	case "c":
		return keyspace.Calendar(tag, k.rule)
	case "s":
		return keyspace.Slots(tag, k.rule)
	case "w":
		return keyspace.Fair(tag, k.rule)
	case "t":
		return keyspace.Tenants(tag, k.rule)
	}
	panic("differ: no Redis key of kind " + k.kind)
}

// diffDecision lists the fields that differ, in (-want +got) style.
func diffDecision(want, got Decision) string {
	var b strings.Builder
	field := func(name string, w, g any, same bool) {
		if !same {
			fmt.Fprintf(&b, "\t-%s: %v\n\t+%s: %v\n", name, w, name, g)
		}
	}
	field("Outcome", want.Outcome, got.Outcome, want.Outcome == got.Outcome)
	field("Delay", want.Delay, got.Delay, want.Delay == got.Delay)
	field("Take", want.TakeIndex, got.TakeIndex, want.TakeIndex == got.TakeIndex)
	field("Key", want.Subject, got.Subject, want.Subject == got.Subject)
	field("Limit", want.Limit, got.Limit, want.Limit == got.Limit)
	field("Remaining", want.Remaining, got.Remaining, want.Remaining == got.Remaining)
	field("Ahead", want.Ahead, got.Ahead, want.Ahead == got.Ahead)
	field("Claimed", want.Claimed, got.Claimed, want.Claimed.Equal(got.Claimed))
	return b.String()
}

func (d *differ) note(s string) {
	const keep = 15
	if len(d.history) == keep {
		d.history = d.history[1:]
	}
	d.history = append(d.history, s)
}

func (d *differ) fail(what string, r Request, nowUS int64, diff string) {
	d.t.Helper()
	d.t.Fatalf("%s at %d µs: mismatch (-want model +got redis):\n%s\nmodel after it:\n%sredis after it:\n%slatest operations before it:\n  %s\nseed %d: rerun with THROTTLE_DIFF_SEED=%d THROTTLE_DIFF_WALKS=1",
		what, nowUS, diff, d.m.dump(r, nowUS), d.redisDump(r), strings.Join(d.history, "\n  "), d.seed, d.seed)
}

// takeKeys is the keys of a take of rule on subject.
func takeKeys(tk Take) []string {
	tag := keyspace.Tag(DefaultPrefix, tk.Subject)
	switch tk.Rule.(type) {
	case *Quota:
		return []string{keyspace.Quota(tag, tk.Rule.Name())}
	case *Bucket:
		return []string{keyspace.Bucket(tag, tk.Rule.Name()), keyspace.Book(tag, tk.Rule.Name()),
			keyspace.Slots(tag, tk.Rule.Name()), keyspace.Fair(tag, tk.Rule.Name()), keyspace.Tenants(tag, tk.Rule.Name())}
	case *CalendarWindow:
		return []string{keyspace.Calendar(tag, tk.Rule.Name())}
	}
	return nil
}

// dumpTakes returns DUMP of every key of r's takes that exists.
func (d *differ) dumpTakes(r Request) map[string]string {
	ctx := context.WithoutCancel(d.t.Context())
	out := map[string]string{}
	for _, tk := range r.Takes {
		for _, k := range takeKeys(tk) {
			v, err := d.rdb.Dump(ctx, k).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				d.t.Fatalf("DUMP %s: %v", k, err)
			}
			out[k] = v
		}
	}
	return out
}

// noTrace checks that the admission of r, denied, wrote nothing to its
// takes' keys (before: dumpTakes before it; tenants: readTenants). A key
// that expired meanwhile is no write of the denial's and is passed over,
// and so are the records of tenants that had stopped waiting, which a
// booking drops from its bucket's tenants whatever it then decides (see
// prunedOnly). Only a task that never took anything is checked: one
// admitted before may give back what it held when it comes again (a
// booking's claim that no longer fits).
func (d *differ) noTrace(op int, r Request, dec Decision, before map[string]string, tenants map[string]map[string]string) {
	d.t.Helper()
	after := d.readTenants(r)
	for k, v := range d.dumpTakes(r) {
		if was, ok := before[k]; !ok || was != v && !prunedOnly(k, tenants, after, float64(dec.Now.UnixMicro())) {
			d.fail(fmt.Sprintf("op %d: invariant: a denied admission changed %s: admit %s -> %s", op, k, describeRequest(r), describeDecision(dec)), r, dec.Now.UnixMicro(), "")
		}
	}
	d.stats.noTrace++
}

// redisDump describes what Redis holds for r's takes.
func (d *differ) redisDump(r Request) string {
	ctx := context.WithoutCancel(d.t.Context())
	var b strings.Builder
	for _, tk := range r.Takes {
		for _, k := range takeKeys(tk) {
			fmt.Fprintf(&b, "  %s: pttl %s ", k, d.rdb.PTTL(ctx, k).Val())
			switch d.rdb.Type(ctx, k).Val() {
			case "zset":
				fmt.Fprintf(&b, "z%v", d.rdb.ZRangeWithScores(ctx, k, 0, -1).Val())
			case "hash":
				fmt.Fprintf(&b, "h%v", d.rdb.HGetAll(ctx, k).Val())
			default:
				b.WriteString("absent")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// describeRequest shows a request in failure messages and the operation log.
func describeRequest(r Request) string {
	parts := make([]string, len(r.Takes))
	for i, t := range r.Takes {
		parts[i] = fmt.Sprintf("%s %s (%s) @%q ×%d", kindName(t.Rule), t.Rule.Name(), t.Rule, t.Subject, t.cost())
		if t.CountOnly {
			parts[i] += " count-only"
		}
	}
	book := ""
	if r.book != nil {
		book = fmt.Sprintf(", Book (priority %v, deadline %d, tenant %q weight %d", r.book.Priority, deadline(r), r.book.Tenant, r.book.Weight)
		if horizon(r) {
			book += fmt.Sprintf(", ahead %s, backlog %v", r.book.Horizon, r.book.Backlog)
		}
		book += ")"
	}
	return fmt.Sprintf("{ID %q, MaxWait %s%s, Takes [%s]}", r.ID, r.MaxWait, book, strings.Join(parts, "; "))
}

// describeDecision shows a decision in the operation log.
func describeDecision(d Decision) string {
	return fmt.Sprintf("%s delay=%s take=%d limit=%q remaining=%d ahead=%d now=%d",
		d.Outcome, d.Delay, d.TakeIndex, d.Limit, d.Remaining, d.Ahead, d.Now.UnixMicro())
}
