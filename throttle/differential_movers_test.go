package throttle

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The differential run's movers: now and then a bucket's rate changes and
// is re-paced (Limiter.Repace), a tenant's weight changes and the lines are
// re-weighed (Limiter.Reweigh), or a provider pauses a bucket
// (Limiter.Pause). Each is run on Redis and on the model (model_movers_test.go)
// at the time Redis used, and the bucket's keys must then agree exactly.

// movers is what a walk knows of the movers it ran.
type movers struct {
	// inLine is, by bucket (its calendar's key), the tasks given a place in
	// line and their tenants: what a worker finds in its queues' retry sets
	// for Reweigh.
	inLine                                                         map[modelKey]map[string]string
	repaces, repaced, reweighs, reweighed, pauses, paused, waiting int
	// started holds, by bucket key and task ID, the slots that had
	// started when their bucket was re-paced (see startedBefore).
	started map[string]bool
	kept    int // releases not made for them
}

// noteStarted notes the slots of bucket take t that had started by now, a
// re-pace's time.
func (d *differ) noteStarted(t *modelTake, now time.Time) {
	// The ledger's entries whose slots started by now (scored minus the start).
	ids, err := d.rdb.ZRangeArgs(d.t.Context(), redis.ZRangeArgs{Key: d.redisKey(t.cal), ByScore: true, Start: strconv.FormatInt(-now.UnixMicro(), 10), Stop: "(0"}).Result()
	if err != nil {
		d.t.Fatal(err)
	}
	if d.mv.started == nil {
		d.mv.started = map[string]bool{}
	}
	for _, id := range ids {
		d.mv.started[d.redisKey(t.cal)+" "+strings.TrimPrefix(id, modelLedger)] = true
	}
}

// startedBefore reports whether r holds a slot that had started when its
// bucket was re-paced: the walk does not release it. A re-pace scales
// the moments after now, so such a slot keeps its start and has its end
// scaled (or, ended, keeps both): its extent is a slot of neither rate,
// and the ledger keeps no cost to tell it by. A release at either rate's
// length may then free a part of the slots after it, other tasks' (by up
// to the rest of the slot, (1 - k) of it, for a release at the old rate
// after a raise; by up to k - 1 slots of the old rate for one at the new
// rate after a cut), and a later booking take it: two takes in one slot.
// That is a limitation of Release after a re-pace, not checked here.
func (d *differ) startedBefore(r Request) bool {
	for _, t := range d.m.parse(r) {
		if t.kind == "b" && d.mv.started[d.redisKey(t.cal)+" "+r.ID] {
			d.mv.kept++
			d.note(fmt.Sprintf("release of %q not made: its slot on %s had started at a re-pace", r.ID, t.cal.rule))
			return true
		}
	}
	return false
}

// moverRequest is the request whose takes name a mover's keys.
func moverRequest(what string, b *Bucket, subject string) Request {
	return Request{ID: what, Takes: []Take{{Rule: b, Subject: subject}}}
}

// buckets is the indexes of the walk's bucket rules.
func (d *differ) buckets() []int {
	var out []int
	for i, r := range d.rules {
		if _, ok := r.(*Bucket); ok {
			out = append(out, i)
		}
	}
	return out
}

// change now and then changes a rule (see changeRule), and now and then
// runs a mover: when movable, not between a denial and its retry.
func (d *differ) change(op int, movable bool) {
	if d.rng.IntN(200) == 0 {
		d.changeRule()
	}
	if movable && d.rng.IntN(100) == 0 {
		d.move(op)
	}
}

// move runs one mover, picked at random.
func (d *differ) move(op int) {
	switch d.rng.IntN(3) {
	case 0:
		d.changeRate(op)
	case 1:
		d.changeWeight(op)
	default:
		bs := d.buckets()
		d.pauseBucket(op, d.rules[bs[d.rng.IntN(len(bs))]].(*Bucket), d.providers[d.rng.IntN(len(d.providers))])
	}
}

// repaceAll re-paces every bucket on every provider, as a worker does at
// start: the rates are recorded, nothing moves.
func (d *differ) repaceAll(op int) {
	for _, i := range d.buckets() {
		for _, s := range d.providers {
			d.repace(op, d.rules[i].(*Bucket), s)
		}
	}
}

// changeRate gives a bucket a new rate (its burst and reserve as they
// were: the costs of the tasks waiting stay within them) and re-paces it
// on every provider, as a worker does after a reload. From then on the
// walk's requests carry the new rule, as a worker builds each request from
// the config it runs: a task waiting since before comes back, or is
// released, with it.
func (d *differ) changeRate(op int) {
	bs := d.buckets()
	i := bs[d.rng.IntN(len(bs))]
	old := d.rules[i].(*Bucket)
	name := old.Name()
	rate := d.newBucket(name).Rate()
	if name == "b3" {
		rate = d.newSlowBucket(name).Rate()
	}
	b, err := mustBucket(d.t, name, rate, old.Burst()).WithReserve(old.reserve)
	if err != nil {
		d.t.Fatal(err)
	}
	d.rules[i] = b
	d.note(fmt.Sprintf("rule %s is now %s, re-paced", name, b))
	retarget := func(r Request) Request {
		r.Takes = slices.Clone(r.Takes)
		for j, t := range r.Takes {
			// (A task of a cost the bucket no longer admits, from before
			// a change of burst, keeps the rule it had.)
			if _, ok := t.Rule.(*Bucket); ok && t.Rule.Name() == name && t.cost() <= b.MaxCost() {
				r.Takes[j].Rule = b
			}
		}
		return r
	}
	for id, r := range d.last {
		d.last[id] = retarget(r)
	}
	for id, r := range d.took {
		d.took[id] = retarget(r)
	}
	for j, c := range d.claims {
		d.claims[j].r = retarget(c.r)
	}
	for _, s := range d.providers {
		d.repace(op, b, s)
	}
}

// repace runs Limiter.Repace of b on subject and the model's, and compares
// their factors and the bucket's keys.
func (d *differ) repace(op int, b *Bucket, subject string) {
	d.t.Helper()
	r := moverRequest("repace", b, subject)
	k, now, err := d.l.Repace(d.t.Context(), b, subject)
	if err != nil {
		d.t.Fatalf("op %d: Repace(%s, %q): %v", op, b, subject, err)
	}
	t := d.m.parse(r)[0]
	want := d.m.repace(t, now.UnixMicro())
	what := fmt.Sprintf("op %d: repace %s (%s) @%q", op, b.Name(), b, subject)
	if math.Ceil(want*1e6) != math.Round(k*1e6) {
		d.fail(what, r, now.UnixMicro(), fmt.Sprintf("\t-k: %v\n\t+k: %v\n", want, k))
	}
	d.mv.repaces++
	if want != 0 {
		// Before the invariants are checked: they allow what this re-pace
		// rounded away.
		d.inv.scaled(d.redisKey(t.cal), want)
	}
	d.ran(op, r, fmt.Sprintf("%s -> k %v at %d", what, k, now.UnixMicro()))
	if want == 0 {
		return
	}
	d.mv.repaced++
	d.noteStarted(t, now)
	at := float64(now.UnixMicro())
	mv := modelScaling(at, want)
	d.moveLines(d.redisKey(t.cal), at, func(string) modelMover { return mv }, func(string) modelMover { return mv })
	d.wakeUps(func(c claim) (float64, bool) { return k, takesOn(c.r, b.Name(), subject) }, now)
}

// ran notes a mover's run (what), and checks its bucket's keys (r's) against
// the model's and the invariants.
func (d *differ) ran(op int, r Request, what string) {
	d.t.Helper()
	d.note(what)
	d.checkState(op, r)
	d.invariants(op, r)
}

// takesOn reports whether r takes bucket name on subject.
func takesOn(r Request, name, subject string) bool {
	for _, t := range r.Takes {
		if _, ok := t.Rule.(*Bucket); ok && t.Rule.Name() == name && t.Subject == subject {
			return true
		}
	}
	return false
}

// wakeUps scales the moments booked tasks come back at, each by the factor
// factor gives it (if any), as jobs.Repace scales the tasks' wake-ups.
func (d *differ) wakeUps(factor func(claim) (float64, bool), now time.Time) {
	for j, c := range d.claims {
		if k, ok := factor(c); ok {
			d.claims[j].at = scale(c.at, now, k)
			d.mv.waiting++
		}
	}
	slices.SortStableFunc(d.claims, func(a, b claim) int { return a.at.Compare(b.at) })
}

// moveLines moves what the invariants know of the places handed out on
// bucket (see placed) as a mover moved the places themselves: a tenant's
// newest place by line(tenant), a task's by place(id) (nil: it stays).
func (d *differ) moveLines(bucket string, now float64, line, place func(string) modelMover) {
	d.inv.init()
	for k, at := range d.inv.line {
		if tn, ok := strings.CutPrefix(k, bucket+" "); ok {
			if mv := line(tn); mv != nil {
				d.inv.line[k] = moveAt(at, now, mv)
			}
		}
	}
	for k, at := range d.inv.place {
		if id, ok := strings.CutPrefix(k, bucket+" "); ok {
			if mv := place(id); mv != nil {
				d.inv.place[k] = moveAt(at, now, mv)
			}
		}
	}
}

// inLine notes the tenant of a task placed in line by dec.
func (d *differ) inLine(r Request, dec Decision) {
	t := d.m.parse(r)[dec.TakeIndex]
	if d.mv.inLine == nil {
		d.mv.inLine = map[modelKey]map[string]string{}
	}
	if d.mv.inLine[t.cal] == nil {
		d.mv.inLine[t.cal] = map[string]string{}
	}
	d.mv.inLine[t.cal][r.ID] = r.book.Tenant
}

// changeWeight gives a tenant a new weight and re-weighs every bucket's
// lines on every provider, as a worker does after a reload.
func (d *differ) changeWeight(op int) {
	tn := d.tenants[d.rng.IntN(len(d.tenants))]
	w := max(1, d.weights[tn])
	for max(1, d.weights[tn]) == w {
		d.weights[tn] = d.rng.IntN(5) // 0: the default, 1
	}
	d.stats.weightChanges++
	d.note(fmt.Sprintf("tenant %q's weight is now %d, re-weighed", tn, d.weights[tn]))
	for _, i := range d.buckets() {
		for _, s := range d.providers {
			d.reweigh(op, d.rules[i].(*Bucket), s)
		}
	}
}

// reweigh runs Limiter.Reweigh of b on subject and the model's, and
// compares their factors and the bucket's keys.
func (d *differ) reweigh(op int, b *Bucket, subject string) {
	d.t.Helper()
	r := moverRequest("reweigh", b, subject)
	t := d.m.parse(r)[0]
	inLine := maps.Clone(d.mv.inLine[t.cal])
	// Every tenant named, as a worker names the tenants it finds waiting.
	weights := maps.Clone(d.weights)
	for _, tn := range d.tenants {
		weights[tn] = d.weights[tn]
	}
	k, now, err := d.l.Reweigh(d.t.Context(), b, subject, weights)
	if err != nil {
		d.t.Fatalf("op %d: Reweigh(%s, %q): %v", op, b, subject, err)
	}
	want := d.m.reweigh(t, weights, now.UnixMicro())
	what := fmt.Sprintf("op %d: reweigh %s @%q to %v", op, b.Name(), subject, weights)
	if (want == nil) != (k == nil) || !sameFactors(want, k) {
		d.fail(what, r, now.UnixMicro(), fmt.Sprintf("\t-k: %v\n\t+k: %v\n", want, k))
	}
	d.mv.reweighs++
	d.ran(op, r, fmt.Sprintf("%s -> k %v at %d", what, k, now.UnixMicro()))
	if want == nil {
		return
	}
	d.mv.reweighed++
	for tn := range want { // (see invariants: it weighs its new weight there)
		d.inv.weighs(d.redisKey(t.cal)+" "+tn, max(1, weights[tn]))
	}
	at := float64(now.UnixMicro())
	line := func(tn string) modelMover {
		if f, ok := want[tn]; ok {
			return modelScaling(at, f)
		}
		return nil
	}
	d.moveLines(d.redisKey(t.cal), at, line, func(id string) modelMover {
		if tn, ok := inLine[id]; ok {
			return line(tn)
		}
		return nil
	})
	d.wakeUps(func(c claim) (float64, bool) {
		tn, ok := inLine[c.r.ID]
		if !ok || !takesOn(c.r, b.Name(), subject) {
			return 0, false
		}
		return k[tn], true
	}, now)
}

// sameFactors reports whether Reweigh's factors (got: each named tenant's,
// rounded up to a millionth; 1 for one not waiting) are the model's (want:
// each waiting tenant's).
func sameFactors(want, got map[string]float64) bool {
	for tn, g := range got {
		w, ok := want[tn]
		if !ok {
			w = 1
		}
		if math.Ceil(w*1e6) != math.Round(g*1e6) {
			return false
		}
	}
	return true
}

// pauseBucket pauses b on subject through Limiter.Pause and in the model,
// and compares the time until the bucket's next slot and its keys.
// Pause does not say what time Redis paused at; a pause that ends later
// than any recorded writes its end, now + d, to the state hash, so the walk
// asks for one that ends later (d past the end recorded, from a moment
// before the call) and reads now back from it.
func (d *differ) pauseBucket(op int, b *Bucket, subject string) {
	d.t.Helper()
	r := moverRequest("pause", b, subject)
	t := d.m.parse(r)[0]
	pause := d.between(20*time.Millisecond, 800*time.Millisecond).Truncate(time.Microsecond)
	if e := d.m.keys[t.key]; e != nil {
		if p, ok := e.h["p"]; ok {
			pause = max(pause, time.Duration(p-float64(time.Now().UnixMicro()))*time.Microsecond+time.Millisecond)
		}
	}
	got, err := d.l.Pause(d.t.Context(), b, subject, pause)
	if err != nil {
		d.t.Fatalf("op %d: Pause(%s, %q, %s): %v", op, b, subject, pause, err)
	}
	p, err := d.rdb.HGet(d.t.Context(), d.redisKey(t.key), "p").Int64()
	if err != nil {
		d.t.Fatalf("op %d: the end of the pause of %s @%q: %v", op, b.Name(), subject, err)
	}
	now := p - pause.Microseconds()
	if e := d.m.keys[t.key]; e != nil && e.h["p"] == float64(p) {
		d.t.Fatalf("op %d: the pause of %s @%q for %s did not extend the one recorded (%d)", op, b.Name(), subject, pause, p)
	}
	want, mv := d.m.pause(t, float64(pause.Microseconds()), now)
	what := fmt.Sprintf("op %d: pause %s (%s) @%q for %s", op, b.Name(), b, subject, pause)
	if time.Duration(want)*time.Microsecond != got {
		d.fail(what, r, now, fmt.Sprintf("\t-next slot in: %v\n\t+next slot in: %v\n", time.Duration(want)*time.Microsecond, got))
	}
	d.mv.pauses++
	d.ran(op, r, fmt.Sprintf("%s -> next slot in %s at %d", what, got, now))
	if mv == nil {
		return
	}
	d.mv.paused++
	all := func(string) modelMover { return mv }
	d.moveLines(d.redisKey(t.cal), float64(now), all, all)
}

// logMovers logs what the walk's movers did.
func (d *differ) logMovers() {
	m := d.mv
	d.t.Logf("movers: %d re-paces (%d scaled), %d re-weighs (%d changed), %d pauses (%d moved work); %d wake-ups moved; "+
		"%d releases not made of slots started before a re-pace", m.repaces, m.repaced, m.reweighs, m.reweighed, m.pauses, m.paused, m.waiting, m.kept)
}

// checkMovers fails the run if a mover never moved anything in any walk.
func checkMovers(t interface{ Errorf(string, ...any) }, ds []*differ) {
	var sum movers
	for _, d := range ds {
		sum.repaced += d.mv.repaced
		sum.reweighed += d.mv.reweighed
		sum.paused += d.mv.paused
	}
	if sum.repaced == 0 || sum.reweighed == 0 || sum.paused == 0 {
		t.Errorf("%d re-paces scaled, %d re-weighs changed, %d pauses moved: the run did not test them", sum.repaced, sum.reweighed, sum.paused)
	}
}
