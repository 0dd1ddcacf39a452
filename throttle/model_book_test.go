package throttle

import (
	"math"
	"slices"
	"strings"
	"time"
)

// The model of lua/book.lua: the same steps in the same order, so that the
// differential test holds bookings, claims and rebookings to the µs.

// modelGrace is book.lua's GRACE.
const modelGrace = 600000000

// modelLate is book.lua's LATE.
const modelLate = 1000000

// modelQRead is rules.lua's QREAD.
const modelQRead = 64

// zdesc returns every score of k, newest (highest) first.
func (c *modelCall) zdesc(k modelKey) []float64 {
	e := c.get(k)
	if e == nil {
		return nil
	}
	s := make([]float64, 0, len(e.z))
	for _, v := range e.z {
		s = append(s, v)
	}
	slices.Sort(s)
	slices.Reverse(s)
	return s
}

// quotaEarliest mirrors quota_earliest: the earliest moment from floor at
// which a new entry fits after the newest and after, in each window, the
// (limit - cost + 1)-th newest entry's leaving; and the window that set it.
func (c *modelCall) quotaEarliest(t *modelTake, floor float64) (float64, int) {
	m, mw := floor, 0
	most := 0.0
	for _, l := range t.limits {
		most = math.Max(most, l)
	}
	z := c.zdesc(t.key)
	if most <= modelQRead && len(z) > int(most-t.cost)+1 {
		z = z[:int(most-t.cost)+1] // ZREVRANGE 0 most-cost
	}
	if len(z) == 0 {
		return m, 0
	}
	if z[0] > m {
		m = z[0]
	}
	for w := range t.limits {
		i := int(t.limits[w] - t.cost) // 0-based
		if i < len(z) {
			if s := z[i] + t.pers[w]; s >= m {
				m, mw = s, w+1
			}
		}
	}
	return m, mw
}

// quotaFits mirrors quota_fits.
func (c *modelCall) quotaFits(t *modelTake, id string, x float64) bool {
	most := 0.0
	for _, l := range t.limits {
		most = math.Max(most, l)
	}
	if most > modelQRead {
		return false
	}
	e := c.get(t.key)
	var others []float64
	n := 0
	if e != nil {
		for mem, s := range e.z {
			if s > x-t.longest && s < x+t.longest {
				n++
				if mem != id && !strings.HasPrefix(mem, id+"\x1f") {
					others = append(others, s)
				}
			}
		}
	}
	if n >= 4*modelQRead {
		return false // read truncated (LIMIT 0 4*QREAD)
	}
	for w := range t.limits {
		room, per := t.limits[w]-t.cost, t.pers[w]
		cands := append([]float64{x}, others...)
		for _, s := range cands {
			if s >= x && s < x+per {
				cnt := 0.0
				for _, o := range others {
					if o > s-per && o <= s {
						cnt++
					}
				}
				if cnt > room {
					return false
				}
			}
		}
	}
	return true
}

// quotaMove mirrors quota_move: the task's entries go to x (ZADD XX).
func (c *modelCall) quotaMove(t *modelTake, id string, x float64) {
	e := c.get(t.key)
	for _, mem := range modelMembers(id, t.cost) {
		if _, ok := e.z[mem]; ok {
			e.z[mem] = x
		}
	}
	c.extend(t.key, x-c.now+t.longest)
}

// ticketAdd mirrors ticket_add.
func (c *modelCall) ticketAdd(k modelKey, id string, at float64) {
	c.getOrCreate(k).z[id] = at
	c.zremrangebyscore(k, c.now-modelGrace)
	c.extend(k, at-c.now+modelGrace)
}

// zcountBelow counts the scores of k below x (ZCOUNT k -inf (x), or in
// (lo, x) when lo is given.
func (c *modelCall) zcountBetween(k modelKey, lo, x float64) int {
	n := 0
	if e := c.get(k); e != nil {
		for _, s := range e.z {
			if s > lo && s < x {
				n++
			}
		}
	}
	return n
}

// book mirrors book_task; ok is false where book_task returns false (the
// ledger holds the task: the plain path answers).
func (c *modelCall) book(r Request, takes []*modelTake, remember float64) (Decision, bool) {
	now, id := c.now, r.ID
	maxwait := float64(r.MaxWait.Microseconds())
	prio := r.Priority
	var bt *modelTake
	bi := 0
	for i, t := range takes {
		if t.kind == "b" {
			bt, bi = t, i+1
		}
	}
	if bt != nil {
		if s, ok := c.bucketHeld(bt, id, remember); ok {
			if s >= now-modelLate {
				return Decision{}, false
			}
			c.bucketUndo(bt, id, remember)
		}
	}
	deadline := 0.0
	if !r.Deadline.IsZero() {
		deadline = float64(max(1, r.Deadline.UnixMicro()))
	}

	var ticket float64
	hasTicket := false
	held := 0.0
	if bt != nil {
		ticket, hasTicket = c.zscore(bt.book, id)
		if hasTicket {
			held = ticket
		}
	}
	qh := make([]float64, len(takes)) // 0: not held
	for i, t := range takes {
		if s, ok := c.entryHeld(t, id); ok {
			qh[i] = s
			held = math.Max(held, s)
		}
	}
	var tokens, life, v, wait, slot float64
	if bt != nil {
		tokens, life, v = c.bucketTokens(bt), c.bucketLife(bt), c.bucketTail(bt)
		wait = c.bucketWait(bt, tokens, bucketNeed(bt, prio))
		slot = math.Ceil(bt.cost * 1e6 / bt.rate)
		bt.tokens, bt.life = tokens, life
	}
	dec := func(allowed bool, binding, window int, delay float64) Decision {
		d := Decision{Allowed: allowed, Now: time.UnixMicro(int64(now)), Take: -1}
		d.Delay = time.Duration(int64(delay)) * time.Microsecond
		if binding > 0 {
			tk := r.Takes[binding-1]
			d.Take, d.Rule, d.Key, d.Limit = binding-1, tk.Rule, tk.Key, tk.Rule.String()
			if q, ok := tk.Rule.(*Quota); ok && window > 0 {
				d.Limit = q.windows[window-1].String()
			}
		}
		return d
	}
	rebooked := false
	if hasTicket || held > 0 {
		if held > now+maxwait {
			d := dec(false, 0, 0, held-now)
			d.Booked = true
			return d, true
		}
		after, pace := 0.0, wait
		if bt != nil && held > now {
			before, last := 0, 0.0
			if e := c.get(bt.book); e != nil {
				for _, s := range e.z {
					if s >= now && s < held {
						before++
						last = math.Max(last, s)
					}
				}
			}
			if before > 0 {
				if need := bucketNeed(bt, prio) + float64(before); tokens < need {
					pace = math.Max(wait, math.Ceil((need-tokens)*1e6/bt.rate))
				}
				after = last + slot
			}
		}
		x := math.Max(now+pace, after)
		for i, t := range takes {
			if qh[i] > x && !t.countOnly && !c.fitsAt(t, id, x) {
				x = qh[i]
			}
		}
		for _, t := range takes {
			if _, quiet := quietEnd(t, x); t.kind == "h" && held > x && quiet {
				x = held
			}
		}
		fits := true
		for i, t := range takes {
			if !fits {
				break
			}
			switch {
			case t.countOnly: // it goes wherever the others let it
			case t.kind == "q" || t.kind == "c":
				if qh[i] > 0 {
					if qh[i] != x && !c.fitsAt(t, id, x) {
						fits = false
					}
				} else if c.earliest(t, now) > x {
					fits = false
				}
			case t.kind == "h":
				if _, quiet := quietEnd(t, x); quiet {
					fits = false
				}
			}
		}
		if fits && x > now+maxwait && held >= now {
			d := dec(false, 0, 0, x-now)
			d.Booked = true
			return d, true
		}
		fits = fits && x <= now+maxwait
		if fits {
			for i, t := range takes {
				if t.kind == "q" || t.kind == "c" {
					if qh[i] == 0 {
						c.entryCommit(t, id, x)
					} else if qh[i] != x {
						c.entryMove(t, id, x)
					}
				} else if t.kind == "b" {
					c.bucketCommit(t, id, x, remember, v)
					if e := c.get(t.book); e != nil {
						delete(e.z, id)
						c.dropIfEmpty(t.book, e)
					}
				}
			}
			d := dec(true, 0, 0, x-now)
			if hasTicket {
				d.Claimed = time.UnixMicro(int64(ticket))
			} else {
				d.Claimed = time.UnixMicro(int64(held))
			}
			return d, true
		}
		for i, t := range takes {
			if qh[i] > 0 {
				c.entryUndo(t, id)
			}
		}
		if hasTicket {
			e := c.get(bt.book)
			delete(e.z, id)
			c.dropIfEmpty(bt.book, e)
		}
		rebooked = true
	}

	m, binding, window, shared := now, 0, 0, false
	for i, t := range takes {
		switch {
		case t.countOnly: // it sets no moment
		case t.kind == "q":
			if q, w := c.quotaEarliest(t, now); q > m {
				m, binding, window, shared = q, i+1, w, false
			}
		case t.kind == "c":
			if q, edge := c.calEarliest(t, now); q > m {
				m, binding, window, shared = q, i+1, 0, edge
			}
		}
	}
	pb := now
	if bt != nil {
		pb = now + wait
		if !prio && v > 0 && v > pb {
			pb = v
		}
		if pb > m {
			m, binding, window, shared = pb, 0, 0, false
		}
	}
	for range 4 {
		for i, t := range takes {
			if e, quiet := quietEnd(t, m); t.kind == "h" && quiet {
				m, binding, window, shared = e, i+1, 0, true
			}
		}
		if !(shared && bt != nil) {
			break
		}
		shared = false
		n := c.zcountBetween(bt.book, m-1, m+modelShared)
		if n == 0 {
			break
		}
		m += float64(n) * slot
	}
	if bt != nil && binding == 0 {
		binding = bi
	}
	if deadline > 0 && m > deadline {
		d := dec(false, binding, window, m-now)
		d.Expired = true
		return d, true
	}
	if far := beyond(takes, m); far > 0 {
		if binding == 0 {
			binding = far
		}
		return dec(false, binding, window, m-now), true
	}
	tail := v
	if bt != nil {
		if prio {
			if v > 0 && v > now {
				tail = v + slot
			}
		} else if m-pb < slot {
			if m+slot > tail && (m > now+maxwait || v > 0 && v > now) {
				tail = m + slot
			}
		}
	}
	if m <= now+maxwait {
		for _, t := range takes {
			switch t.kind {
			case "q", "c":
				c.entryCommit(t, id, m)
			case "b":
				c.bucketCommit(t, id, m, remember, tail)
			}
		}
		if m == now {
			binding, window = 0, 0
		}
		return dec(true, binding, window, m-now), true
	}
	ahead := 0
	for _, t := range takes {
		if t.kind == "q" || t.kind == "c" {
			c.entryCommit(t, id, m)
		}
	}
	if bt != nil {
		c.ticketAdd(bt.book, id, m)
		if tail != v {
			c.bucketStore(bt, tokens, 0, tail)
		}
		ahead = c.zcountBetween(bt.book, math.Inf(-1), m)
	} else {
		for i, t := range takes {
			if i+1 == binding && (t.kind == "q" || t.kind == "c") {
				ahead = c.zcountBetween(t.key, now, m)
			}
		}
	}
	d := dec(false, binding, window, m-now)
	d.Booked, d.Rebooked, d.Ahead = true, rebooked, ahead
	return d, true
}
