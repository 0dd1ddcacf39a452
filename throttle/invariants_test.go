package throttle

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The differential run compares every operation with the model, which says
// the same steps as the Lua in Go: a mistake in the algorithm would be in
// both. invariants checks, after every admission of the run, what the
// rules promise, read from Redis alone:
//
//   - a bucket's busy spans never overlap, and every slot a task holds
//     ahead (in the ledger or as a ticket) lies in one: so no two takes
//     share time, which is what bounds a bucket's grants by rate·T + burst;
//   - slots held ahead start at least a slot of cost 1 apart;
//   - a quota's entries fit each of its windows: no window of length P
//     holds more than its limit of entries, bookings ahead included;
//   - a tenant's line on a bucket moves on: each new place it is given is
//     at least a slot (of cost 1) after its place before, so no
//     two of its tasks share a moment in line, whatever the weights (a
//     task back early is told its own place again; that is no new place);
//   - a tenant takes no more than its share of a line: a task placed for
//     the first time is placed at least slot·W/w after its tenant's place
//     before while that lies ahead, w the tenant's weight and W at least
//     w plus the weights of the other tenants whose lines on the bucket
//     lie ahead (each at the least weight it has booked with there). A
//     task placed again takes a place behind all those handed out, not its
//     tenant's share: that may be closer;
//   - a denial leaves no trace: an admission of one request, for a task
//     that never took anything, that is denied writes nothing to any key
//     of its takes (noTrace; a key that expired meanwhile is passed over,
//     and a booking may drop the records of tenants that stopped waiting,
//     as Redis drops a key that expired: see prunedOnly).
//
// A re-pace (Limiter.Repace) scales each moment ahead on its own, rounded
// up to a whole µs: a slot laid at the old rate may come out up to a µs
// shorter than a slot of the new rate, and two slots' starts up to a µs
// closer. Giving such a slot back at the new rate frees that µs of the next
// one. The bucket checks allow what the re-paces of a bucket can have
// rounded away (see rounding), never more. A re-weigh writes each waiting
// tenant's new weight into its record: from then on the tenant weighs that
// there, as if it had booked with it.
//
// Rules changed during the walk (a limit applies at once to the history
// laid under the old one) and quotas that count-only takes wrote to (they
// count and never deny) are not held to their windows. A bucket on which a
// task was admitted again at another cost is not checked for slots in
// busy spans: its release gives back a slot of its request's cost
// (Release's contract), which may free a neighbour's.

// invariantState is what the invariants need to know of the walk so far.
type invariantState struct {
	changed   map[string]bool     // rule names replaced during the walk
	countOnly map[string]bool     // quota keys a count-only take wrote to
	costs     map[string]int      // each task's cost on a bucket, by bucket key and ID
	mixed     map[string]bool     // bucket keys a task took at two costs
	line      map[string]float64  // each tenant's newest place, by bucket key and tenant
	place     map[string]float64  // each task's place, by bucket key and ID
	weight    map[string]int      // each tenant's least weight booked with, by bucket key and tenant
	heaviest  map[string]int      // and its greatest (its record's weight wins while it waits)
	rounded   map[string]rounding // by bucket key: what re-paces rounded away
}

// rounding is what the re-paces of a bucket can have rounded away: how
// much shorter than a slot of the bucket's rate a slot may be (short), and
// how much closer than a slot the starts of two slots held may be (gap;
// before any re-pace, 1).
type rounding struct{ short, gap float64 }

// scaled notes a re-pace of bucket by k. A length or distance l >= L - e
// at the old rate (L its slot) becomes at least floor(l k) >= L' - 1 -
// ceil(e k) at the new one (L' its slot): L k >= L' - 1, since L is
// rounded up from the exact slot.
func (s *invariantState) scaled(bucket string, k float64) {
	s.init()
	r, ok := s.rounded[bucket]
	if !ok {
		r.gap = 1
	}
	s.rounded[bucket] = rounding{short: 1 + math.Ceil(r.short*k), gap: 1 + math.Ceil(r.gap*k)}
}

// weighs notes that a tenant (k: bucket key and tenant) weighs w there.
func (s *invariantState) weighs(k string, w int) {
	if was, ok := s.weight[k]; !ok || w < was {
		s.weight[k] = w
	}
	s.heaviest[k] = max(s.heaviest[k], w)
}

// init makes the state's maps.
func (s *invariantState) init() {
	if s.changed == nil {
		*s = invariantState{changed: map[string]bool{}, countOnly: map[string]bool{}, costs: map[string]int{}, mixed: map[string]bool{},
			line: map[string]float64{}, place: map[string]float64{}, weight: map[string]int{}, heaviest: map[string]int{}, rounded: map[string]rounding{}}
	}
}

// took records what an admission of r that reserved something took.
func (s *invariantState) took(r Request, m *model, key func(modelKey) string) {
	s.init()
	for i, t := range m.parse(r) {
		if t.kind != "b" {
			continue
		}
		k, c := key(t.cal), r.Takes[i].cost()
		if was, ok := s.costs[k+" "+r.ID]; ok && was != c {
			s.mixed[k] = true
		}
		s.costs[k+" "+r.ID] = c
	}
}

// booking notes the weight that r, about to be booked, books with on each
// of its buckets: what its tenant weighs there at the least.
func (d *differ) booking(r Request) {
	d.inv.init()
	for _, t := range d.m.parse(r) {
		if t.kind != "b" {
			continue
		}
		k := d.redisKey(t.cal) + " " + r.book.Tenant
		d.inv.weighs(k, weightOf(r))
	}
}

// weightOf is r's weight as the script takes it: 1 when unset.
func weightOf(r Request) int { return max(r.book.Weight, 1) }

// placed checks the place in line that decision dec gave r (see above):
// its tenant's line on the binding bucket moves on by at least a slot, and
// by its share when r is placed for the first time.
func (d *differ) placed(op int, r Request, dec Decision) {
	d.t.Helper()
	d.inv.init()
	t := d.m.parse(r)[dec.TakeIndex]
	if t.kind != "b" || d.inv.changed[t.cal.rule] {
		return
	}
	bucket := d.redisKey(t.cal)
	at := float64(dec.At().UnixMicro())
	if d.inv.place[bucket+" "+r.ID] == at {
		return // back early: its own place again
	}
	_, again := d.inv.place[bucket+" "+r.ID]
	d.inv.place[bucket+" "+r.ID] = at
	lineKey := bucket + " " + r.book.Tenant
	slot := math.Ceil(1e6 / t.rate) // of cost 1: the tasks before may have cost less than this one
	prev, ok := d.inv.line[lineKey]
	if ok && at < prev+slot-2 {
		d.fail(fmt.Sprintf("op %d: invariant: tenant %q placed at %.0f on %s, %.0f µs after its place before (%.0f): less than a slot (%.0f µs)",
			op, r.book.Tenant, at, t.cal.rule, at-prev, prev, slot), r, dec.Now.UnixMicro(), "")
	}
	if now := float64(dec.Now.UnixMicro()); ok && !again && prev > now {
		// Its own weight is the one its record holds, which may be one it
		// booked with before: the greatest such bounds its stride.
		w := max(weightOf(r), d.inv.heaviest[lineKey])
		W, others := w, []string{}
		for k, line := range d.inv.line {
			if tn, ok := strings.CutPrefix(k, bucket+" "); ok && tn != r.book.Tenant && line > now {
				W += d.inv.weight[k]
				others = append(others, fmt.Sprintf("%q (weight %d) at %.0f", tn, d.inv.weight[k], line))
			}
		}
		d.stats.shareChecks++
		if W > w {
			d.stats.sharedChecks++
		}
		if stride := math.Ceil(slot * float64(W) / float64(w)); at < prev+stride-2 {
			slices.Sort(others)
			d.fail(fmt.Sprintf("op %d: invariant: tenant %q (weight %d) placed at %.0f on %s, %.0f µs after its place before (%.0f): less than its share's stride, %.0f µs, with others waiting: %s",
				op, r.book.Tenant, w, at, t.cal.rule, at-prev, prev, stride, strings.Join(others, ", ")), r, dec.Now.UnixMicro(), "")
		}
	}
	d.inv.line[lineKey] = at
}

// invariants checks the rules of r after op (see above).
func (d *differ) invariants(op int, r Request) {
	d.t.Helper()
	d.inv.init()
	ctx := context.WithoutCancel(d.t.Context())
	for i, t := range d.m.parse(r) {
		switch t.kind {
		case "b":
			d.checkBucket(ctx, op, r, t)
		case "q":
			key := d.redisKey(t.key)
			if r.Takes[i].CountOnly {
				d.inv.countOnly[key] = true
			}
			if !d.inv.countOnly[key] && !d.inv.changed[t.key.rule] {
				d.checkWindows(ctx, op, r, t, key)
			}
		}
	}
}

// checkBucket checks a bucket's spans and the slots held ahead on it.
func (d *differ) checkBucket(ctx context.Context, op int, r Request, t *modelTake) {
	// One snapshot, at one Redis time: on a busy machine a key read a
	// moment after the time was taken may have expired with the slots that
	// ended in between.
	var tm *redis.TimeCmd
	var cal, book *redis.ZSliceCmd
	_, err := d.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		cal = p.ZRangeWithScores(ctx, d.redisKey(t.cal), 0, -1)
		book = p.ZRangeWithScores(ctx, d.redisKey(t.book), 0, -1)
		return nil
	})
	if err != nil {
		d.t.Fatal(err)
	}
	now := float64(tm.Val().UnixMicro())
	spans, ledger := d.spans(d.redisKey(t.cal), cal.Val())
	// Only time from now on is busy or free: a span written from 0 (see
	// PAST in rules.lua) hides free time in the past, and the past spans it
	// covers wait for the prune.
	var ahead [][2]float64
	for _, sp := range spans {
		if sp[1] > now {
			ahead = append(ahead, [2]float64{max(sp[0], now), sp[1]})
		}
	}
	spans = ahead
	slices.SortFunc(spans, func(a, b [2]float64) int { return cmp.Compare(a[0], b[0]) })
	for i := 1; i < len(spans); i++ {
		if spans[i][0] < spans[i-1][1] {
			d.fail(fmt.Sprintf("op %d: invariant: busy spans %v and %v of %s overlap", op, spans[i-1], spans[i], t.cal.rule), r, int64(now), "")
		}
	}
	if d.inv.changed[t.cal.rule] || d.inv.mixed[d.redisKey(t.cal)] {
		return
	}
	len1 := math.Ceil(1e6 / t.rate)
	round, ok := d.inv.rounded[d.redisKey(t.cal)]
	if !ok {
		round.gap = 1
	}
	var held []float64
	for _, z := range [][]redis.Z{ledger, book.Val()} {
		for _, e := range z {
			if e.Score < now {
				continue
			}
			held = append(held, e.Score)
			if !inSpan(spans, e.Score, round.short) {
				d.fail(fmt.Sprintf("op %d: invariant: %v's slot at %.0f on %s is in no busy span %v", op, e.Member, e.Score, t.cal.rule, spans), r, int64(now), "")
			}
		}
	}
	slices.Sort(held)
	for i := 1; i < len(held); i++ {
		if held[i]-held[i-1] < len1-round.gap {
			d.fail(fmt.Sprintf("op %d: invariant: slots held at %.0f and %.0f on %s, less than a slot (%.0f µs) apart", op, held[i-1], held[i], t.cal.rule, len1), r, int64(now), "")
		}
	}
}

// spans are the busy spans of calendar key, read as z: [start, end) in
// µs; and its ledger's entries, each scored its slot's start.
func (d *differ) spans(key string, z []redis.Z) (out [][2]float64, ledger []redis.Z) {
	for _, e := range z {
		m := e.Member.(string)
		if strings.HasPrefix(m, modelLedger) {
			ledger = append(ledger, redis.Z{Member: m, Score: -e.Score})
			continue
		}
		if strings.HasPrefix(m, "-") {
			continue // a mark of the calendar's life
		}
		start, err := strconv.ParseFloat(m, 64)
		if err != nil {
			d.t.Fatalf("calendar %s: span %q: %v", key, m, err)
		}
		out = append(out, [2]float64{start, e.Score})
	}
	return out, ledger
}

// inSpan reports whether moment v lies in one of spans, or short µs
// before one.
func inSpan(spans [][2]float64, v, short float64) bool {
	for _, s := range spans {
		if s[0]-short <= v && v < s[1] {
			return true
		}
	}
	return false
}

// checkWindows checks that a quota's entries fit each of its windows.
func (d *differ) checkWindows(ctx context.Context, op int, r Request, t *modelTake, key string) {
	z, err := d.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		d.t.Fatal(err)
	}
	at := make([]float64, len(z))
	for i, e := range z {
		at[i] = e.Score
	}
	slices.Sort(at)
	for w := range t.limits {
		limit, per := int(t.limits[w]), t.pers[w]
		for j := range at {
			// The window (at[j] - per, at[j]] ends at an entry: the most
			// a window of length per holds is found at one of them.
			lo, _ := slices.BinarySearchFunc(at, at[j]-per, func(a, b float64) int {
				if a <= b {
					return -1
				}
				return 1
			})
			if n := j - lo + 1; n > limit {
				d.fail(fmt.Sprintf("op %d: invariant: %s holds %d entries within %.0f µs up to %.0f, over its window %d per %.0f µs",
					op, key, n, per, at[j], limit, per), r, 0, "")
			}
		}
	}
}

// readTenants reads the tenants hash and the tenants' expiry set of each
// of r's buckets: field or member -> value or score.
func (d *differ) readTenants(r Request) map[string]map[string]string {
	ctx := context.WithoutCancel(d.t.Context())
	out := map[string]map[string]string{}
	for _, t := range d.m.parse(r) {
		if t.kind != "b" {
			continue
		}
		fair, exp := d.redisKey(t.fair), d.redisKey(t.tenants)
		h, err := d.rdb.HGetAll(ctx, fair).Result()
		if err != nil {
			d.t.Fatal(err)
		}
		z, err := d.rdb.ZRangeWithScores(ctx, exp, 0, -1).Result()
		if err != nil {
			d.t.Fatal(err)
		}
		out[fair], out[exp] = h, map[string]string{}
		for _, e := range z {
			out[exp][e.Member.(string)] = strconv.FormatFloat(e.Score, 'f', -1, 64)
		}
	}
	return out
}

// prunedOnly reports whether key, a bucket's tenants hash or their expiry
// set, went from before[key] to after[key] only by dropping tenants that
// had stopped waiting by now (book.lua's fair_read): records whose expiry
// had passed, W lowered by exactly their weights, and expiry set members
// whose score had passed. Anything else is a trace.
func prunedOnly(key string, before, after map[string]map[string]string, now float64) bool {
	was, ok := before[key]
	if !ok {
		return false
	}
	is, hash := after[key], strings.HasSuffix(key, ":fair")
	dropped := 0.0
	for f, v := range was {
		if got, ok := is[f]; ok {
			if got != v && !(hash && f == modelFairW) {
				return false
			}
			continue
		}
		switch {
		case !hash:
			if modelNum(v) > now {
				return false
			}
		case f == modelFairW || f == modelFairJ || f == modelFairP:
			return false
		default:
			_, _, w, exp := fairRecord(v)
			if exp > now {
				return false
			}
			dropped += w
		}
	}
	for f := range is {
		if _, ok := was[f]; !ok {
			return false
		}
	}
	if hash && was[modelFairW] != is[modelFairW] {
		return modelNum(is[modelFairW]) == modelNum(was[modelFairW])-dropped
	}
	return true
}
