package throttle

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// model is a pure-Go reference of lua/rules.lua, admit.lua and release.lua:
// the same steps in the same order on float64 (Lua's only number type), so
// that it agrees with Redis bit for bit and a difference is one of behaviour,
// not of rounding. (No step is of the form x*y+z, so Go cannot fuse one into
// an FMA and round differently from Redis.)
//
// Keys are named by kind, rule and raw subject rather than by
// internal/keyspace, so the key building is under test too: two subjects
// sharing a Redis key would show up as a difference.
type model struct {
	keys map[modelKey]*modelEntry
	// lost counts entries that still counted (a quota entry inside its longest
	// window, a span or ledger entry's slot ahead) when their key expired:
	// the scripts' PEXPIRE can shorten a key's life (see TestDifferential).
	lost map[string]int // by key kind
	// fair counts the paths of book.lua's fair shares and horizon a run
	// took (see TestDifferential).
	fair map[string]int
	// ambiguous holds the keys the model let expire within modelExpiryMS
	// of their deadline: Redis judges a key's expiry by its script's start
	// (a few µs to ms before the TIME the model runs at), so it may have
	// kept them (see checkState).
	ambiguous map[modelKey]bool
}

// modelExpiryMS is how far past its deadline a key's expiry may be judged
// differently by the model and by Redis (a script preempted between its
// start and its TIME).
const modelExpiryMS = 20

type modelKey struct {
	kind    string // "q" quota set, "b" bucket hash, "k" bucket tickets, "s" bucket slot calendar (and ledger), "w" bucket tenants hash, "t" bucket tenants' expiry set, "c" calendar quota
	rule    string
	subject string
}

// modelEntry is one Redis key: a sorted set (z) or a hash (h: every field the
// scripts write holds a number; s: the hash whose fields are strings, a
// bucket's tenants), and its PEXPIRE deadline.
type modelEntry struct {
	z     map[string]float64
	h     map[string]float64
	s     map[string]string
	expMS int64 // Unix ms; 0: no expiry
	// keep is how long (µs) the last commit meant its entries to count: the
	// quota's longest window, the ledger's remember; keeps, a quota
	// member's own, by the rule that wrote it (a rule whose windows grew
	// since counts the entries booked ahead under the old one longer than
	// their key was made to live: that loss is the rule change's). Only for
	// model.lost.
	keep  float64
	keeps map[string]float64
}

func newModel() *model {
	return &model{keys: map[modelKey]*modelEntry{}, lost: map[string]int{}, fair: map[string]int{}, ambiguous: map[modelKey]bool{}}
}

// modelCall is one script run: its µs time from TIME and the ms time key
// expiry is judged by.
//
// Redis judges expiry inside a script by the ms clock read when the script
// started, and PEXPIRE counts from the ms clock when it runs (7.0) or from
// that same start (7.2 on); both are a few µs from TIME, so the model uses
// floor(TIME/1000) for both. They differ only when a ms boundary falls in
// those µs, which matters only for a key expiring in exactly that ms.
type modelCall struct {
	m     *model
	now   float64
	nowMS int64
}

func (m *model) at(nowUS int64) *modelCall {
	return &modelCall{m: m, now: float64(nowUS), nowMS: nowUS / 1000}
}

// get returns the key, or nil if it is absent or has expired. Redis's
// keyIsExpired (db.c) and its active expiry both drop a key once
// now > when, so a key is still there during its deadline's own ms.
func (c *modelCall) get(k modelKey) *modelEntry {
	e := c.m.keys[k]
	if e != nil && e.expMS != 0 && c.nowMS > e.expMS {
		if c.nowMS-e.expMS <= modelExpiryMS {
			c.m.ambiguous[k] = true
		}
		c.noteTenantsLost(k, e)
		delete(c.m.keys, k)
		return nil
	}
	return e
}

func (c *modelCall) getOrCreate(k modelKey) *modelEntry {
	e := c.get(k)
	if e == nil {
		e = &modelEntry{z: map[string]float64{}, h: map[string]float64{}, s: map[string]string{}}
		c.m.keys[k] = e
	}
	return e
}

// dropIfEmpty mirrors Redis deleting an emptied set or hash (and its TTL).
func (c *modelCall) dropIfEmpty(k modelKey, e *modelEntry) {
	if len(e.z) == 0 && len(e.h) == 0 && len(e.s) == 0 {
		delete(c.m.keys, k)
	}
}

// noteLost counts, if k has expired by now, the members that the rule which
// last wrote k would still count (a rule changed since may count longer).
func (c *modelCall) noteLost(k modelKey) {
	e := c.m.keys[k]
	if e == nil || e.expMS == 0 || c.nowMS <= e.expMS {
		return
	}
	for m, s := range e.z {
		if strings.HasPrefix(m, modelLedger) {
			s = -s // a ledger entry: its slot's start
		}
		keep, ok := e.keeps[m]
		if !ok {
			keep = e.keep
		}
		if s > c.now-keep {
			c.m.lost[k.kind]++
		}
	}
}

// modelCeilMS is rules.lua's ceil_ms.
func modelCeilMS(us float64) float64 {
	ms := math.Ceil(us / 1000)
	if ms < 1 {
		ms = 1
	}
	return ms + 1
}

// pexpire mirrors PEXPIRE key ceil_ms(us) on an existing key.
func (c *modelCall) pexpire(k modelKey, us float64) {
	if e := c.get(k); e != nil {
		e.expMS = c.nowMS + int64(modelCeilMS(us))
	}
}

// extend mirrors rules.lua's extend: PEXPIRE only if PTTL is shorter.
func (c *modelCall) extend(k modelKey, us float64) {
	e := c.get(k)
	if e == nil {
		return
	}
	ms := int64(modelCeilMS(us))
	if e.expMS == 0 || e.expMS-c.nowMS < ms {
		e.expMS = c.nowMS + ms
	}
}

// zremrangebyscore mirrors ZREMRANGEBYSCORE k -inf max.
func (c *modelCall) zremrangebyscore(k modelKey, max float64) {
	e := c.get(k)
	if e == nil {
		return
	}
	for m, s := range e.z {
		if s <= max {
			delete(e.z, m)
		}
	}
	c.dropIfEmpty(k, e)
}

func (c *modelCall) zscore(k modelKey, member string) (float64, bool) {
	e := c.get(k)
	if e == nil {
		return 0, false
	}
	s, ok := e.z[member]
	return s, ok
}

// zabove returns the scores of k above lo (ZRANGEBYSCORE k (lo +inf), ascending.
func (c *modelCall) zabove(k modelKey, lo float64) []float64 {
	var s []float64
	for _, p := range c.zpairsAbove(k, lo) {
		s = append(s, p.s)
	}
	return s
}

// modelTake is one parsed take and what its check found (rules.lua's t).
type modelTake struct {
	kind           string
	cost           float64
	key, book, cal modelKey
	fair, tenants  modelKey // a bucket's tenants hash and their expiry set
	kept           float64  // a bucket's reserve for priority requests

	limits, pers []float64 // quota
	longest      float64
	rate, burst  float64    // bucket
	limit        float64    // calendar
	found        modelFound // a bucket's slot, found by its check
	ok, repeated bool
	wait, delay  float64
	reserve      float64
	reserves     bool // t.reserve is set
	remaining    float64
	window       int  // quota window that set delay, 1-based; 0: none
	countOnly    bool // Take.CountOnly: recorded, never denying or waiting

	bounds      []float64 // calendar
	from, until float64   // quiet hours' cover
	spans       []float64 // quiet hours: start, end, start, end...
}

// parse mirrors rules.lua's parse, reading the limits from the rules
// themselves rather than from the arguments the engine builds.
func (m *model) parse(r Request) []*modelTake {
	ts := make([]*modelTake, len(r.Takes))
	for i, tk := range r.Takes {
		t := &modelTake{cost: float64(tk.cost()), countOnly: tk.CountOnly}
		switch rule := tk.Rule.(type) {
		case *Quota:
			t.kind, t.key = "q", modelKey{"q", rule.name, tk.Subject}
			for _, w := range rule.windows {
				t.limits = append(t.limits, float64(w.Limit))
				t.pers = append(t.pers, float64(w.Per.Microseconds()))
				if p := t.pers[len(t.pers)-1]; p > t.longest {
					t.longest = p
				}
			}
		case *Bucket:
			t.kind = "b"
			t.key = modelKey{"b", rule.name, tk.Subject}
			t.book, t.cal = modelKey{"k", rule.name, tk.Subject}, modelKey{"s", rule.name, tk.Subject}
			t.fair, t.tenants = modelKey{"w", rule.name, tk.Subject}, modelKey{"t", rule.name, tk.Subject}
			t.rate, t.burst, t.kept = rule.rate, float64(rule.burst), float64(rule.reserve)
		case *CalendarWindow:
			t.kind, t.key = "c", modelKey{"c", rule.name, tk.Subject}
			t.limit = float64(rule.limit)
			for _, b := range rule.bounds {
				t.bounds = append(t.bounds, float64(b.UnixMicro()))
			}
		case *Quiet:
			t.kind = "h"
			t.from, t.until = float64(rule.from.UnixMicro()), float64(rule.until.UnixMicro())
			for _, sp := range rule.spans {
				t.spans = append(t.spans, float64(sp.From.UnixMicro()), float64(sp.To.UnixMicro()))
			}
		default:
			panic(fmt.Sprintf("model: unknown rule %T", tk.Rule))
		}
		ts[i] = t
	}
	return ts
}

// modelMembers is rules.lua's members: ID, then ID\x1fk for k = 2..cost.
func modelMembers(id string, cost float64) []string {
	m := []string{id}
	for k := 2; k <= int(cost); k++ {
		m = append(m, fmt.Sprintf("%s\x1f%d", id, k))
	}
	return m
}

// quotaCheck reads and never writes: entries older than the longest window
// (stale) count for nothing, the task's own included, and are left for the
// next commit to prune.
func (c *modelCall) quotaCheck(t *modelTake, id string) {
	now := c.now
	c.noteLost(t.key)
	mine, isMine := c.zscore(t.key, id)
	if isMine && mine <= now-t.longest {
		isMine = false
	}
	if isMine {
		t.repeated = true
		t.wait = math.Max(0, mine-now)
	}
	t.ok, t.delay, t.remaining = true, 0, math.Inf(1)
	for w := range t.limits {
		in := c.zabove(t.key, now-t.pers[w])
		n := float64(len(in))
		left := t.limits[w] - n
		if !isMine {
			need := n + t.cost - t.limits[w]
			if need > 0 {
				// The need-th oldest entry in the window leaves it at its score + per.
				d := in[int(need)-1] + t.pers[w] - now
				t.ok = false
				if d > t.delay {
					t.delay, t.window = d, w+1
				}
			} else {
				left = left - t.cost
			}
		}
		if left < t.remaining {
			t.remaining = left
		}
	}
}

// quotaCommit prunes the stale entries, then adds the task's.
func (c *modelCall) quotaCommit(t *modelTake, id string, at float64) {
	c.zremrangebyscore(t.key, c.now-t.longest)
	e := c.getOrCreate(t.key)
	if e.keeps == nil {
		e.keeps = map[string]float64{}
	}
	for _, mem := range modelMembers(id, t.cost) {
		e.z[mem], e.keeps[mem] = at, t.longest
	}
	e.keep = t.longest
	c.extend(t.key, at-c.now+t.longest)
}

// quotaUndo undoes a holding: the task's entries, unless its entry is
// stale. Like a commit, it sets the key's life by this rule: the remaining
// entries' until they are stale under it.
func (c *modelCall) quotaUndo(t *modelTake, id string) bool {
	if s, ok := c.zscore(t.key, id); !ok || s <= c.now-t.longest {
		return false
	}
	e := c.get(t.key)
	for _, mem := range modelMembers(id, t.cost) {
		delete(e.z, mem)
	}
	if len(e.z) > 0 {
		last := math.Inf(-1)
		for _, sc := range e.z {
			last = math.Max(last, sc)
		}
		c.pexpire(t.key, last-c.now+t.longest)
		e.keep, e.keeps = t.longest, nil // every entry's life is now this rule's
	}
	c.dropIfEmpty(t.key, e)
	return true
}

// modelInt is rules.lua's int: a whole number as '%d'.
func modelInt(x float64) string { return strconv.FormatInt(int64(x), 10) }

// modelFindSteps is rules.lua's FIND_STEPS.
const modelFindSteps = 64

// bucketLen mirrors bucket_len: the µs a take's slot lasts.
func bucketLen(t *modelTake) float64 { return math.Ceil(t.cost * 1e6 / t.rate) }

// bucketSlack mirrors bucket_slack: how long before its slot a take may go.
func bucketSlack(t *modelTake, prio bool) float64 {
	b := t.burst - t.cost
	if !prio {
		b = b - t.kept
	}
	if b <= 0 {
		return 0
	}
	return math.Floor(b * 1e6 / t.rate)
}

// modelSpan is a busy span of a calendar, [a, b).
type modelSpan struct{ a, b float64 }

// spanAfter mirrors ZRANGEBYSCORE cal (x +inf LIMIT 0 1: the span that ends
// first after x (at x too, with from: bucket_find's first read).
func (c *modelCall) spanAfter(k modelKey, x float64, from bool) (modelSpan, bool) {
	e := c.get(k)
	if e == nil {
		return modelSpan{}, false
	}
	var best modelSpan
	found := false
	for m, end := range e.z {
		if end < x || end == x && !from {
			continue
		}
		a, err := strconv.ParseFloat(m, 64)
		if err != nil {
			panic(err)
		}
		if !found || end < best.b || end == best.b && m < modelInt(best.a) {
			best, found = modelSpan{a, end}, true
		}
	}
	return best, found
}

// modelFound is what bucket_find returns: the slot and the spans it touches
// (not ok: none found within modelFindSteps spans, and v how far it got).
type modelFound struct {
	v        float64
	ok       bool
	left     float64 // start of the span ending at v
	hasLeft  bool
	right    modelSpan // the span starting at v + len
	hasRight bool
	next     bool // a span follows the slot (right, or one after a gap)
}

// bucketFind mirrors bucket_find.
func (c *modelCall) bucketFind(t *modelTake, s, length float64) modelFound {
	f := modelFound{v: s}
	for i := range modelFindSteps {
		sp, ok := c.spanAfter(t.cal, f.v, i == 0)
		if !ok {
			f.ok = true
			return f
		}
		if sp.a >= f.v+length {
			if sp.a == f.v+length {
				f.right, f.hasRight = sp, true
			}
			f.ok, f.next = true, true
			return f
		}
		f.v, f.left, f.hasLeft = sp.b, sp.a, true
	}
	return modelFound{v: f.v} // not ok: no slot is free before v, how far it got
}

// modelCalLife is rules.lua's CAL_LIFE, modelPruneBin its PRUNE_BIN,
// modelStepPruneRate its STEP_PRUNE_RATE.
const (
	modelCalLife       = 100000
	modelPruneBin      = 10000000
	modelStepPruneRate = 100
)

// bucketAdd mirrors bucket_add: a span that starts now starts at 0, the
// merged span is written before the one it absorbs is removed, with task
// id's ledger entry if id is not "", and a last span adds the marks of its
// end's step of modelCalLife and of that step's modelPruneBin. A new bin
// prunes the calendar up to now and writes the two marks again; a new step
// or bin extends the calendar to the step's end and keep. It returns 0, 1 (a new step) or 2 (a new bin).
func (c *modelCall) bucketAdd(t *modelTake, f modelFound, length, keep float64, id string) int {
	a, b := f.v, f.v+length
	if f.hasLeft {
		a = f.left
	} else if f.v <= c.now {
		a = 0 // a span that starts now is written from 0 (rules.lua's PAST)
	}
	if f.hasRight {
		b = f.right.b
	}
	e := c.getOrCreate(t.cal)
	e.z[modelInt(a)] = b
	if id != "" {
		e.z[modelLedger+id] = -f.v
	}
	if f.hasRight {
		delete(e.z, modelInt(f.right.a))
	}
	if f.next {
		return 0
	}
	d := (math.Floor(b/modelCalLife) + 1) * modelCalLife
	marks := []string{"-" + modelInt(d), "-" + modelInt(math.Floor(d/modelPruneBin))}
	n := 0
	for _, m := range marks {
		if _, ok := e.z[m]; !ok {
			n++
		}
		e.z[m] = 0
	}
	switch n {
	case 0:
		return 0
	case 2:
		c.zremrange(t.cal, -(c.now - keep - length), c.now, false)
		e = c.getOrCreate(t.cal)
		for _, m := range marks {
			e.z[m] = 0
		}
	}
	c.extend(t.cal, d-c.now+keep)
	return n
}

// bucketFree mirrors bucket_free: the part before v is kept while ahead.
func (c *modelCall) bucketFree(t *modelTake, v, length float64) {
	sp, ok := c.spanAfter(t.cal, v, false)
	if !ok || sp.a > v || sp.b < v+length {
		return
	}
	e := c.get(t.cal)
	if sp.b > v+length {
		e.z[modelInt(v+length)] = sp.b
	}
	if sp.a < v && v > c.now {
		e.z[modelInt(sp.a)] = v
	} else {
		delete(e.z, modelInt(sp.a))
		c.dropIfEmpty(t.cal, e)
	}
}

// modelLedger starts a ledger entry's member in a bucket's calendar
// (rules.lua's LEDGER).
const modelLedger = "#"

// ledgerHold mirrors ledger_hold: the entry scores minus the slot's start.
func (c *modelCall) ledgerHold(t *modelTake, id string, v float64) {
	c.getOrCreate(t.cal).z[modelLedger+id] = -v
}

// ledger returns the bucket's ledger: its entries' members (modelLedger
// and the task ID) and their slots' starts.
func (c *modelCall) ledger(t *modelTake) map[string]float64 {
	out := map[string]float64{}
	if e := c.get(t.cal); e != nil {
		for m, s := range e.z {
			if strings.HasPrefix(m, modelLedger) {
				out[m] = -s
			}
		}
	}
	return out
}

// zremrange mirrors ZREMRANGEBYSCORE k min max, max exclusive if open.
func (c *modelCall) zremrange(k modelKey, min, max float64, open bool) {
	e := c.get(k)
	if e == nil {
		return
	}
	for m, s := range e.z {
		if s >= min && (s < max || !open && s == max) {
			delete(e.z, m)
		}
	}
	c.dropIfEmpty(k, e)
}

// bucketHeld mirrors bucket_held: the slot the ledger holds for id, unless
// it has ended.
func (c *modelCall) bucketHeld(t *modelTake, id string) (float64, bool) {
	s, ok := c.zscore(t.cal, modelLedger+id)
	if !ok || -s+bucketLen(t) <= c.now {
		return 0, false
	}
	return -s, true
}

// bucketCheck mirrors bucket_check. unheld, when not 0, is the longest
// window of the first take, a quota that holds no entry of the task: a slot
// that ends within that of the entry's moment is taken as not held, and the
// ledger is not read. A task whose first quota changed since it took a slot
// (a policy changed by SIGHUP) so takes a second one, and the first stays
// held until it ends.
func (c *modelCall) bucketCheck(t *modelTake, id string, denied, prio bool, unheld float64) {
	now := c.now
	c.noteLost(t.cal)
	length, slack := bucketLen(t), bucketSlack(t, prio)
	t.ok, t.delay = true, 0
	f := c.bucketFind(t, now, length)
	known := unheld > 0 && unheld >= length+bucketSlack(t, true)
	if !denied && !known {
		if mine, ok := c.bucketHeld(t, id); ok {
			t.repeated = true
			t.wait = math.Max(0, mine-slack-now)
			if f.ok {
				t.remaining = math.Max(0, math.Floor((now+slack-f.v)/length)+1)
			}
			return
		}
	}
	if !f.ok {
		t.reserve, t.reserves, t.wait = f.v-now, true, f.v-now
		return
	}
	t.found = f
	wait := math.Max(0, f.v-slack-now)
	t.remaining = math.Max(0, math.Floor((now+slack-f.v)/length))
	if wait > 0 {
		t.reserve, t.reserves, t.wait = wait, true, wait
	}
}

// bucketCommit mirrors bucket_commit: the slot bucketCheck found.
func (c *modelCall) bucketCommit(t *modelTake, id string, keep float64) {
	c.bucketCommitAt(t, t.found, id, keep)
}

// bucketCommitAt mirrors bucket_commit of slot f: its span and ledger
// entry, and a new step of a fast bucket's calendar prunes the ledger.
func (c *modelCall) bucketCommitAt(t *modelTake, f modelFound, id string, keep float64) {
	length := bucketLen(t)
	if c.bucketAdd(t, f, length, keep, id) == 1 && t.rate > modelStepPruneRate {
		c.zremrange(t.cal, -(c.now - keep - length), 0, true) // a new step prunes a fast bucket's ledger
	}
}

// bucketUndo mirrors bucket_undo: a slot that has ended is no holding; with
// refund the slot is freed unless a pause covers it.
func (c *modelCall) bucketUndo(t *modelTake, id string, refund bool) bool {
	length := bucketLen(t)
	s, ok := c.bucketHeld(t, id)
	if !ok {
		return false
	}
	e := c.get(t.cal)
	delete(e.z, modelLedger+id)
	c.dropIfEmpty(t.cal, e)
	if refund {
		c.bucketGive(t, s, length)
	}
	return true
}

// bucketGive mirrors bucket_give: the slot is freed unless it has ended or
// a pause covers it.
func (c *modelCall) bucketGive(t *modelTake, s, length float64) {
	if s+length <= c.now {
		return
	}
	p, has := 0.0, false
	if h := c.get(t.key); h != nil {
		p, has = h.h["p"]
	}
	if !has || p <= s {
		c.bucketFree(t, s, length)
	}
}

// admit mirrors admit.lua run at nowUS, then builds the Decision the way
// Limiter.Admit does on one node (decision in wire.go).
func (m *model) admit(r Request, nowUS, rememberUS int64) Decision {
	c := m.at(nowUS)
	id, maxwait, remember := r.ID, float64(r.MaxWait.Microseconds()), float64(rememberUS)
	takes := m.parse(r)

	denied := false
	delay, binding, remaining, repeated := 0.0, 0, math.Inf(1), true
	unheld := 0.0 // admit.lua's unheld: the first take, a quota, holds no entry of the task
	for i, t := range takes {
		switch t.kind {
		case "q":
			c.quotaCheck(t, id)
			if i == 0 && !t.countOnly && !t.repeated {
				unheld = t.longest
			}
		case "b":
			c.bucketCheck(t, id, denied, r.book != nil && r.book.Priority, unheld)
		case "c":
			c.calCheck(t, id, maxwait)
		case "h":
			c.quietCheck(t, maxwait)
		}
		if t.countOnly {
			t.ok, t.delay, t.wait, t.window, t.remaining = true, 0, 0, 0, math.Inf(1)
		}
		if !t.ok {
			denied = true
		}
		untilOK := math.Max(math.Max(t.delay, t.reserve), t.wait) // reserve is 0 when unset, like "t.reserve or 0"
		if untilOK > delay {
			delay, binding = untilOK, i+1
		}
		if t.reserves && t.reserve > maxwait {
			denied = true
		}
		if t.remaining < remaining {
			remaining = t.remaining
		}
		if !t.repeated && t.kind != "h" {
			repeated = false
		}
	}
	if remaining < 0 || math.IsInf(remaining, 1) {
		remaining = 0
	}
	// admit.lua: a task that books goes the plain way only when it may go
	// now holding nothing, with no line on its bucket and no ticket.
	if r.book != nil && !r.check {
		goNow := !denied && delay == 0 && (r.book.Deadline.IsZero() || c.now <= float64(max(1, r.book.Deadline.UnixMicro())))
		unbooked := false // never_booked: holds none of a quota's or calendar's entries
		for _, t := range takes {
			if (t.kind == "q" || t.kind == "c") && !t.repeated {
				unbooked = true
			}
		}
		for _, t := range takes {
			if !goNow {
				break
			}
			if t.repeated {
				goNow = false
			}
			if t.kind == "b" && !unbooked {
				if _, ok := c.zscore(t.book, ticketMember(id, t.cost)); ok {
					goNow = false
				}
			}
		}
		if !goNow {
			// The checks only read: book starts from the same state, and
			// where it declines (the ledger holds the task) the plain
			// path goes on with what they found.
			if d, ok := c.book(r, takes, remember); ok {
				return d
			}
		}
	}

	window := 0
	if denied {
		repeated = false
		if binding > 0 {
			window = takes[binding-1].window
		}
	} else if !r.check { // a check writes nothing
		at := c.now + delay
		for _, t := range takes {
			if t.repeated {
				continue
			}
			switch t.kind {
			case "q":
				c.quotaCommit(t, id, at)
			case "b":
				c.bucketCommit(t, id, remember)
			case "c":
				c.calCommit(t, id, at)
			}
		}
	}
	if !denied && delay == 0 {
		binding = 0
	}

	// Redis turns Lua numbers into integer replies by truncation.
	d := Decision{Outcome: Admitted, Now: time.UnixMicro(nowUS), TakeIndex: -1, Remaining: int(int64(remaining))}
	switch {
	case denied:
		d.Outcome = Denied
	case repeated:
		d.Outcome = Repeated
	}
	if denied || delay > 0 {
		d.Delay = time.Duration(int64(delay)) * time.Microsecond
		if binding > 0 {
			tk := r.Takes[binding-1]
			d.TakeIndex, d.Rule, d.Subject, d.Limit = binding-1, tk.Rule, tk.Subject, tk.Rule.String()
			if q, ok := tk.Rule.(*Quota); ok && window > 0 {
				d.Limit = q.windows[window-1].String()
			}
		}
	}
	return d
}

// release mirrors release.lua run at nowUS and returns the takes undone.
func (m *model) release(r Request, nowUS int64) int {
	const refund = true
	c := m.at(nowUS)
	undone := 0
	for _, t := range m.parse(r) {
		var done bool
		switch t.kind {
		case "q":
			done = c.quotaUndo(t, r.ID)
		case "b":
			done = c.bucketUndo(t, r.ID, refund)
			member := ticketMember(r.ID, t.cost)
			if s, ok := c.zscore(t.book, member); ok {
				e := c.get(t.book)
				delete(e.z, member)
				c.dropIfEmpty(t.book, e)
				c.bucketGive(t, s, bucketLen(t))
				done = true
			}
		case "c":
			done = c.calUndo(t, r.ID)
		}
		if done {
			undone++
		}
	}
	return undone
}

// dump describes the model's state of the keys r's takes use, as of nowUS
// (without expiring anything), for failure messages.
func (m *model) dump(r Request, nowUS int64) string {
	var b strings.Builder
	for _, t := range m.parse(r) {
		if t.kind == "h" {
			continue // no key
		}
		ks := []modelKey{t.key}
		if t.kind == "b" {
			ks = append(ks, t.book, t.cal, t.fair, t.tenants)
		}
		for _, k := range ks {
			e := m.keys[k]
			fmt.Fprintf(&b, "  %s %s@%q: ", k.kind, k.rule, k.subject)
			if e == nil {
				b.WriteString("absent\n")
				continue
			}
			fmt.Fprintf(&b, "pttl %dms ", e.expMS-nowUS/1000)
			if len(e.z) > 0 {
				fmt.Fprintf(&b, "z%v ", modelPairs(e.z))
			}
			if len(e.h) > 0 {
				fmt.Fprintf(&b, "h%v", modelPairs(e.h))
			}
			if len(e.s) > 0 {
				fmt.Fprintf(&b, "h%v", modelStrings(e.s))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// modelStrings lists a string hash's fields, like modelPairs.
func modelStrings(m map[string]string) []string { return modelFields(m, "%q=%q") }

func modelPairs(m map[string]float64) []string { return modelFields(m, "%q=%.17g") }

// modelFields lists m's fields and values in format, sorted.
func modelFields[V any](m map[string]V, format string) []string {
	var s []string
	for k, v := range m {
		s = append(s, fmt.Sprintf(format, k, v))
	}
	slices.Sort(s)
	return s
}
