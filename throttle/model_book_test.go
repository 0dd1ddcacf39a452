package throttle

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The model of lua/book.lua: the same steps in the same order, so that the
// differential test holds bookings, claims and rebookings to the µs.

// modelGrace is book.lua's GRACE.
const modelGrace = 600000000

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

// slotOf mirrors slot_of: the slot start of the ticket in book (nil:
// none) of quota member m's task, if it holds one (of cost 1).
func (c *modelCall) slotOf(book *modelKey, m string) (float64, bool) {
	if book == nil {
		return 0, false
	}
	task, _, _ := strings.Cut(m, "\x1f")
	return c.zscore(*book, task)
}

// quotaFits mirrors quota_fits.
func (c *modelCall) quotaFits(t *modelTake, id string, x float64, book *modelKey, slack float64) bool {
	most := 0.0
	for _, l := range t.limits {
		most = math.Max(most, l)
	}
	e := c.get(t.key)
	if most > modelQRead {
		least := slices.Min(t.limits)
		return e == nil || float64(len(e.z)) <= least
	}
	var others []float64
	n := 0
	if e != nil {
		for mem, s := range e.z {
			if s > x-t.longest && s < x+t.longest {
				n++
				if mem != id && !strings.HasPrefix(mem, id+"\x1f") {
					if v, ok := c.slotOf(book, mem); ok && v-slack > s {
						s = v - slack // where it will go (see quota_fits)
					}
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
			if e.keeps != nil {
				e.keeps[mem] = t.longest // its life is now the mover's rule's
			}
		}
	}
	c.extend(t.key, x-c.now+t.longest)
}

// ticketMember mirrors book.lua's ticket_member.
func ticketMember(id string, cost float64) string {
	if cost == 1 {
		return id
	}
	return id + "\x1e" + modelInt(cost)
}

// ticketCost mirrors ticket_cost.
func ticketCost(member string) float64 {
	if i := strings.IndexByte(member, '\x1e'); i >= 0 {
		c, err := strconv.ParseFloat(member[i+1:], 64)
		if err != nil {
			panic(err)
		}
		return c
	}
	return 1
}

// ticketAdd mirrors ticket_add: the slot goes busy and the ticket holds it.
func (c *modelCall) ticketAdd(t *modelTake, member string, f modelFound, length, keep float64) {
	c.bucketAdd(t, f, length, keep, "")
	c.zremrangebyscore(t.book, c.now-modelGrace)
	c.getOrCreate(t.book).z[member] = f.v
	c.extend(t.book, f.v-c.now+modelGrace)
}

// modelBumpMargin and modelPrioSoon are book.lua's BUMP_MARGIN and PRIO_SOON.
const modelBumpMargin, modelPrioSoon, modelClaim = 50000, 200000, 2500000

// bumpClaimed mirrors book.lua's bump_claimed.
func (c *modelCall) bumpClaimed(t *modelTake, from, before float64) (float64, bool) {
	if t.cost != 1 {
		return 0, false
	}
	one := *t
	one.cost, one.kept = 1, 0
	lo := math.Max(from, c.now+modelBumpMargin+bucketSlack(&one, true))
	if lo >= before {
		return 0, false
	}
	member, s, found := "", 0.0, false
	for m, v := range c.ledger(t) {
		if v < lo || v >= before {
			continue
		}
		if !found || v < s || v == s && m > member { // ZREVRANGEBYSCORE: the last member of a score first
			member, s, found = m, v, true
		}
	}
	if !found {
		return 0, false
	}
	e := c.get(t.cal)
	delete(e.z, member)
	c.dropIfEmpty(t.cal, e)
	return s, true
}

// takeAhead mirrors book.lua's take_ahead.
func (c *modelCall) takeAhead(t *modelTake, from, before, length, keep float64) (float64, bool) {
	first := before
	if e := c.get(t.book); e != nil {
		for _, v := range e.z {
			if v >= from && v < first {
				first = v
			}
		}
	}
	if s, ok := c.bumpClaimed(t, from, first); ok {
		return s, true
	}
	return c.bump(t, from, before, length, keep)
}

// bump mirrors book.lua's bump.
func (c *modelCall) bump(t *modelTake, from, before, length, keep float64) (float64, bool) {
	e := c.get(t.book)
	if e == nil {
		return 0, false
	}
	member, s, found := "", 0.0, false
	for m, v := range e.z {
		if v < from || v >= before {
			continue
		}
		if !found || v < s || v == s && m < member {
			member, s, found = m, v, true
		}
	}
	if !found {
		return 0, false
	}
	vlen := math.Ceil(ticketCost(member) * 1e6 / t.rate)
	if vlen < length {
		return 0, false
	}
	f := c.bucketFind(t, s, vlen)
	if !f.ok {
		return 0, false
	}
	c.bucketAdd(t, f, vlen, keep, "")
	c.getOrCreate(t.book).z[member] = f.v
	c.extend(t.book, f.v-c.now+modelGrace)
	return s, true
}

// zcountBetween counts the scores of k in (lo, x).
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
	prio := r.book.Priority
	var bt *modelTake
	bi := 0
	for i, t := range takes {
		if t.kind == "b" {
			bt, bi = t, i+1
		}
	}
	var length, slack float64
	member := ""
	if bt != nil {
		length, slack, member = bucketLen(bt), bucketSlack(bt, prio), ticketMember(id, bt.cost)
		if _, ok := c.bucketHeld(bt, id); ok {
			return Decision{}, false
		}
	}
	deadline := 0.0
	if !r.book.Deadline.IsZero() {
		deadline = float64(max(1, r.book.Deadline.UnixMicro()))
	}

	var ticket float64
	hasTicket := false
	held := 0.0
	var waitingOn *modelKey // the book whose tasks a claim's fit counts where they will go
	if bt != nil {
		ticket, hasTicket = c.zscore(bt.book, member)
		waitingOn = &bt.book
	}
	qh := make([]float64, len(takes)) // 0: not held
	for i, t := range takes {
		if s, ok := c.entryHeld(t, id); ok {
			qh[i] = s
			held = math.Max(held, s)
		}
	}
	dec := func(allowed bool, binding, window int, delay float64) Decision {
		d := Decision{Now: time.UnixMicro(int64(now)), TakeIndex: -1}
		if allowed {
			d.Outcome = Admitted
		}
		d.Delay = time.Duration(int64(delay)) * time.Microsecond
		if binding > 0 {
			tk := r.Takes[binding-1]
			d.TakeIndex, d.Rule, d.Subject, d.Limit = binding-1, tk.Rule, tk.Subject, tk.Rule.String()
			if q, ok := tk.Rule.(*Quota); ok && window > 0 {
				d.Limit = q.windows[window-1].String()
			}
		}
		return d
	}
	rebooked := false
	if hasTicket || held > 0 {
		x := math.Max(now, held)
		late := bt != nil && !hasTicket
		booked := held
		if hasTicket {
			booked = math.Max(held, ticket-slack)
			x = math.Max(x, booked)
			if h := c.get(bt.key); h != nil {
				if p, ok := h.h["p"]; ok && p > x {
					x = p
				}
			}
			if x >= ticket+length {
				late = true // past its slot (book.lua's claim_moment)
			}
		}
		if !late && x > now+math.Max(maxwait, modelClaim) {
			d := dec(false, 0, 0, x-now)
			d.Outcome = Booked
			return d, true
		}
		fits := !late
		for i, t := range takes {
			if !fits {
				break
			}
			switch {
			case t.countOnly: // it goes wherever the others let it
			case t.kind == "q" || t.kind == "c":
				if qh[i] > 0 {
					if qh[i] != x && !c.fitsAt(t, id, x, waitingOn, slack) {
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
		if fits {
			for i, t := range takes {
				if t.kind == "q" || t.kind == "c" {
					if qh[i] == 0 {
						c.entryCommit(t, id, x)
					} else if qh[i] != x {
						c.entryMove(t, id, x)
					}
				} else if t.kind == "b" {
					e := c.get(t.book)
					delete(e.z, member)
					c.dropIfEmpty(t.book, e)
					c.ledgerHold(t, id, ticket)
				}
			}
			d := dec(true, 0, 0, x-now)
			d.Claimed = time.UnixMicro(int64(booked))
			return d, true
		}
		for i, t := range takes {
			if qh[i] > 0 {
				c.entryUndo(t, id)
			}
		}
		if hasTicket {
			e := c.get(bt.book)
			delete(e.z, member)
			c.dropIfEmpty(bt.book, e)
			c.bucketGive(bt, ticket, length)
		}
		rebooked = true
	}

	m, binding, window := now, 0, 0
	for i, t := range takes {
		switch {
		case t.countOnly: // it sets no moment
		case t.kind == "q":
			if q, w := c.quotaEarliest(t, now); q > m {
				m, binding, window = q, i+1, w
			}
		case t.kind == "c":
			if q, _ := c.calEarliest(t, now); q > m {
				m, binding, window = q, i+1, 0
			}
		}
	}
	// The tenant's share, where the bucket sets the moment.
	H := float64(r.book.Horizon.Microseconds())
	near, gate, placed := false, 0.0, false // placed: back from a place in line
	var fr *modelFair
	if bt != nil && !prio {
		near = H == 0 || m <= now+H
	}
	if near {
		fr = c.fairRead(bt, r.book.Tenant, float64(max(r.book.Weight, 1)), length)
		if fr.W > fr.w {
			gate = fr.gate
		}
		if H > 0 {
			switch {
			case r.book.Back: // back from its place: its slot is from now on
				placed, gate = true, math.Max(gate, now)
			case fr.line() > now+H:
				c.m.fair["line end"]++
				return c.inPlace(r, bt, fr, math.Max(m, fr.line()), length, deadline, false, dec, bi), true
			}
		}
	}
	var f modelFound
	taken, m0 := false, m // m0: the quotas' moment, for the counts
	for range 4 {
		for i, t := range takes {
			if e, quiet := quietEnd(t, m); t.kind == "h" && quiet {
				m, binding, window = e, i+1, 0
			}
		}
		if bt == nil {
			break
		}
		f = c.bucketFind(bt, c.fairStart(bt, m, gate, length), length)
		if !f.ok {
			return dec(false, bi, 0, f.v-now), true // until how far the search got
		}
		x := math.Max(m, f.v-slack)
		if prio && x > now+math.Min(maxwait, modelPrioSoon) {
			s, ok := c.takeAhead(bt, math.Max(now, m), f.v, length, remember)
			if ok {
				f = modelFound{v: s, ok: true}
				taken, x = true, math.Max(m, s-slack)
			}
		}
		if x > m {
			m, binding, window = x, bi, 0
		}
		quiet := false
		for _, t := range takes {
			if _, q := quietEnd(t, m); t.kind == "h" && q {
				quiet = true
			}
		}
		if !quiet {
			break
		}
		taken = false
	}
	if bt != nil && binding == 0 {
		binding = bi
	}
	sleep := maxwait // back from its place at least modelClaim; none for a fresh task while unseen work waits behind it
	switch {
	case placed:
		sleep = math.Max(maxwait, modelClaim)
	case r.book.Backlog && H > 0:
		sleep = 0
	}
	if near && H > 0 && binding == bi && (m > now+H || placed && m > now+sleep && m > gate+length) {
		// Past the horizon: a place in the tenant's line, not a slot.
		if placed {
			c.m.fair["placed again"]++
			if m <= now+H {
				c.m.fair["behind"]++
			}
		}
		join := fr.line() <= now+H
		if join {
			c.m.fair["join"]++
		}
		return c.inPlace(r, bt, fr, math.Max(m, fr.again(placed, fr.line())), length, deadline, join, dec, bi), true
	}
	if deadline > 0 && m > deadline {
		d := dec(false, binding, window, m-now)
		d.Outcome = Expired
		return d, true
	}
	if far := beyond(takes, m); far > 0 {
		if binding == 0 {
			binding = far
		}
		return dec(false, binding, window, m-now), true
	}
	goNow := m <= now+sleep
	for _, t := range takes {
		switch {
		case t.kind == "q" || t.kind == "c":
			c.entryCommit(t, id, m)
		case t.kind != "b": // holds nothing
		case goNow:
			if !taken {
				c.bucketCommitAt(t, f, id, remember)
				break
			}
			c.ledgerHold(t, id, f.v)
		case taken:
			c.getOrCreate(t.book).z[member] = f.v
			c.extend(t.book, f.v-c.now+modelGrace)
		default:
			c.ticketAdd(t, member, f, length, remember)
		}
	}
	if near {
		if placed {
			c.m.fair["returned"]++ // booked through here
		}
		if ff := c.bucketFind(bt, m0, length); gate > m0 && ff.ok && ff.v < gate {
			c.m.fair["gated"]++ // a free slot before its gate
		}
		others := fr.W > fr.w
		if others {
			fr.gate = math.Max(fr.gate, f.v-length) + fr.stride(length)
		}
		c.fairWrite(bt, fr, others)
	}
	if goNow {
		if m == now {
			binding, window = 0, 0
		}
		return dec(true, binding, window, m-now), true
	}
	ahead := 0
	if bt != nil {
		ahead = c.zcountBetween(bt.book, math.Inf(-1), f.v)
	} else {
		for i, t := range takes {
			if i+1 == binding && (t.kind == "q" || t.kind == "c") {
				ahead = c.zcountBetween(t.key, now, m)
			}
		}
	}
	d := dec(false, binding, window, m-now)
	d.Outcome, d.Ahead = Booked, ahead
	if rebooked {
		d.Outcome = Rebooked
	}
	return d, true
}

// fairStart mirrors book.lua's fair_start: the gate, or the end of the busy
// span just before it when that is less than a slot before it.
func (c *modelCall) fairStart(t *modelTake, m, gate, length float64) float64 {
	s := math.Max(m, gate)
	if gate <= m {
		return s
	}
	e, found := 0.0, false
	if en := c.get(t.cal); en != nil {
		for _, end := range en.z {
			if end <= s && (!found || end > e) {
				e, found = end, true
			}
		}
	}
	if found && e > s-length && e >= m {
		s = e
	}
	return s
}
