package throttle

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// The model of lua/repace.lua (repace, reweigh and the movers) and
// lua/pause.lua: the same steps in the same order, so that the differential
// run holds the waiting work they move to the µs.

// modelMover is repace.lua's mover: where a moment after now moves to.
type modelMover func(t float64) float64

// modelScaling mirrors scaling: around now by k.
func modelScaling(now, k float64) modelMover {
	return func(t float64) float64 { return now + math.Ceil((t-now)*k) }
}

// modelShifting mirrors shifting: the moments from pivot on by d.
func modelShifting(pivot, d float64) modelMover {
	return func(t float64) float64 {
		if t < pivot {
			return t
		}
		return t + d
	}
}

// moveAt mirrors move_at: moments up to now stay.
func moveAt(t, now float64, mv modelMover) float64 {
	if t <= now {
		return t
	}
	return mv(t)
}

// modelMember is a sorted set's member and score.
type modelMember struct {
	m string
	s float64
}

// zpairsAbove mirrors ZRANGEBYSCORE k (lo +inf WITHSCORES: by score, then
// by member.
func (c *modelCall) zpairsAbove(k modelKey, lo float64) []modelMember {
	e := c.get(k)
	if e == nil {
		return nil
	}
	var z []modelMember
	for m, s := range e.z {
		if s > lo {
			z = append(z, modelMember{m, s})
		}
	}
	slices.SortFunc(z, func(a, b modelMember) int {
		if a.s != b.s {
			if a.s < b.s {
				return -1
			}
			return 1
		}
		return strings.Compare(a.m, b.m)
	})
	return z
}

// zremAll mirrors ZREM of each of z's members, one by one: a set emptied
// goes, its TTL with it.
func (c *modelCall) zremAll(k modelKey, z []modelMember) {
	for _, p := range z {
		c.zrem(k, p.m)
	}
}

// moveCalendar mirrors move_calendar.
func (c *modelCall) moveCalendar(cal modelKey, mv modelMover) {
	now := c.now
	z := c.zpairsAbove(cal, now)
	if len(z) == 0 {
		return
	}
	c.zremAll(cal, z)
	e, last := c.getOrCreate(cal), now
	for _, p := range z {
		end := moveAt(p.s, now, mv)
		e.z[modelInt(moveAt(modelNum(p.m), now, mv))] = end
		last = math.Max(last, end)
	}
	c.extend(cal, last-now+modelCalLife)
}

// moveSet mirrors move_set: tickets, the tenants' expiries, places in line.
func (c *modelCall) moveSet(set modelKey, mv modelMover) {
	now := c.now
	z := c.zpairsAbove(set, now)
	if len(z) == 0 {
		return
	}
	e, last := c.get(set), now
	for _, p := range z {
		v := moveAt(p.s, now, mv)
		e.z[p.m] = v
		last = math.Max(last, v)
	}
	c.extend(set, last-now+modelGrace)
}

// keepTenants mirrors keep_tenants.
func (c *modelCall) keepTenants(fair, exp modelKey, last float64) {
	if last > c.now {
		c.extend(fair, last-c.now)
		c.extend(exp, last-c.now)
	}
}

// moveTenants mirrors move_tenants.
func (c *modelCall) moveTenants(fair, exp modelKey, mv modelMover) {
	now, last := c.now, c.now
	if e := c.get(fair); e != nil {
		for f, v := range e.s {
			switch f {
			case modelFairW:
			case modelFairJ, modelFairP:
				e.s[f] = modelInt(moveAt(modelNum(v), now, mv))
			default:
				a, b, _, x := fairRecord(v)
				w := strings.Split(v, ",")[2] // as written (%s)
				x = moveAt(x, now, mv)
				last = math.Max(last, x)
				e.s[f] = modelInt(moveAt(a, now, mv)) + "," + modelInt(moveAt(b, now, mv)) + "," + w + "," + modelInt(x)
			}
		}
	}
	c.moveSet(exp, mv)
	c.keepTenants(fair, exp, last)
}

// moveWaiting mirrors move_waiting: the slots claimed ahead from from on are
// taken from their tasks, and those from freeFrom on freed (length µs
// each); the rest of the waiting work moves by mv.
func (c *modelCall) moveWaiting(t *modelTake, from, freeFrom float64, mv modelMover, length float64) {
	// The ledger's entries of the slots after from, as ZRANGEBYSCORE
	// reads them in the calendar: by score (minus the slot's start).
	var claimed []modelMember
	for m, v := range c.ledger(t) {
		if v > from {
			claimed = append(claimed, modelMember{m, v})
		}
	}
	slices.SortFunc(claimed, func(a, b modelMember) int {
		if a.s != b.s {
			return cmp.Compare(b.s, a.s)
		}
		return strings.Compare(a.m, b.m)
	})
	for _, p := range claimed {
		c.zrem(t.cal, p.m)
		if p.s > freeFrom {
			c.bucketFree(t, p.s, length)
		}
	}
	c.moveCalendar(t.cal, mv)
	c.moveSet(t.book, mv)
	c.moveTenants(t.fair, t.tenants, mv)
}

// repace mirrors repace.lua's repace of bucket take t at nowUS: it returns
// k, 0 when nothing was scaled.
func (m *model) repace(t *modelTake, nowUS int64) float64 {
	c := m.at(nowUS)
	var old, oldBurst float64
	var had, hadBurst bool
	if e := c.get(t.key); e != nil {
		old, had = e.h["r"]
		oldBurst, hadBurst = e.h["b"]
	}
	e := c.getOrCreate(t.key)
	e.h["r"], e.h["b"] = t.rate, t.burst
	if !had && e.expMS == 0 {
		c.pexpire(t.key, modelGrace)
	}
	if !had || old == t.rate {
		return 0
	}
	// The slots waiting were laid at the old rate and burst.
	was := *t
	was.cost, was.rate, was.kept = 1, old, 0
	if hadBurst {
		was.burst = oldBurst
	}
	k := old / t.rate
	c.moveWaiting(t, c.now, c.now+modelBumpMargin+bucketSlack(&was, true), modelScaling(c.now, k), bucketLen(&was))
	return k
}

// modelLive is a waiting tenant's record as reweigh reads it.
type modelLive struct{ last, gate, w, exp, nw float64 }

// reweigh mirrors repace.lua's reweigh of bucket take t at nowUS, with the
// tenants' weights (absent or below 1: 1) and the tenants of the tasks in
// line. It returns each waiting tenant's k, nil when no weight changed.
func (m *model) reweigh(t *modelTake, weights map[string]int, nowUS int64) map[string]float64 {
	c := m.at(nowUS)
	now := c.now
	e := c.get(t.fair)
	if e == nil {
		return nil
	}
	W, live := 0.0, map[string]modelLive{}
	for f, v := range e.s {
		switch f {
		case modelFairW:
			W = modelNum(v)
		case modelFairJ, modelFairP:
		default:
			if a, b, w, x := fairRecord(v); x > now {
				live[f] = modelLive{a, b, w, x, float64(max(1, weights[f]))}
			}
		}
	}
	W2, changed := W, false
	for _, r := range live {
		W2 = W2 - r.w + r.nw
		changed = changed || r.nw != r.w
	}
	if !changed {
		return nil
	}
	k, kmax, latest := map[string]float64{}, 1.0, now
	e.s[modelFairW] = modelInt(W2)
	for tn, r := range live {
		k[tn] = (W2 / r.nw) / (W / r.w)
		kmax = math.Max(kmax, k[tn])
		mv := modelScaling(now, k[tn])
		x := moveAt(r.exp, now, mv)
		latest = math.Max(latest, x)
		e.s[tn] = modelInt(moveAt(r.last, now, mv)) + "," + modelInt(moveAt(r.gate, now, mv)) + "," + modelInt(r.nw) + "," + modelInt(x)
		if ex := c.get(t.tenants); ex != nil {
			if _, ok := ex.z[tn]; ok {
				ex.z[tn] = x // ZADD XX
			}
		}
	}
	for _, f := range []string{modelFairJ, modelFairP} {
		if v, ok := e.s[f]; ok {
			e.s[f] = modelInt(moveAt(modelNum(v), now, modelScaling(now, kmax)))
		}
	}
	c.keepTenants(t.fair, t.tenants, latest)
	return k
}

// inFlight mirrors pause.lua's in_flight.
func (c *modelCall) inFlight(t *modelTake, slack, length float64) float64 {
	m := c.now
	for _, s := range c.ledger(t) {
		if s > c.now-length && s <= c.now+slack {
			m = math.Max(m, s+length)
		}
	}
	return m
}

// pause mirrors pause.lua's pause of bucket take t for us µs at nowUS; it
// returns the µs until the first slot after it, and how it moved the
// waiting work (nil: not at all).
func (m *model) pause(t *modelTake, us float64, nowUS int64) (float64, modelMover) {
	c := m.at(nowUS)
	now := c.now
	e := now + us
	slack := bucketSlack(t, true)
	a, b := now, e+slack
	old, had := 0.0, false
	if h := c.get(t.key); h != nil {
		old, had = h.h["p"]
	}
	pivot := c.inFlight(t, slack, bucketLen(t))
	was := pivot
	if had && old+slack > was {
		was = old + slack
	}
	var mv modelMover
	if b > was {
		mv = modelShifting(pivot, b-was)
		one := *t
		one.cost = 1
		c.moveWaiting(t, now+slack, now+modelBumpMargin+slack, mv, bucketLen(&one))
	}
	z := c.zpairsAbove(t.cal, a)
	for _, p := range z {
		s := modelNum(p.m)
		if s > b {
			break
		}
		c.zrem(t.cal, p.m)
		a, b = math.Min(a, s), math.Max(b, p.s)
	}
	c.getOrCreate(t.cal).z[modelInt(a)] = b
	c.extend(t.cal, b-now)
	if !had || old < e {
		c.getOrCreate(t.key).h["p"] = e
		c.extend(t.key, e-now+modelGrace)
	}
	return math.Ceil(b - slack - now), mv
}
