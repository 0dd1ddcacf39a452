package throttle

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The model of book.lua's fair shares and horizon (fair_read, fair_write,
// place_of, note_place, leave_line, in_place): a bucket's tenants hash
// (model key "w": each waiting tenant's "F,G,w,E" and, under "\x00W", W),
// its tenants' expiry set ("t") and its places in line ("p": task ID ->
// place).

// modelFairPad is book.lua's FAIR_PAD.
const modelFairPad = 1000000

// modelFairW and modelFairJ are book.lua's FAIR_W and FAIR_J: W's and the
// join cursor's fields in the tenants hash.
const (
	modelFairW = "\x00W"
	modelFairJ = "\x00J"
	modelFairP = "\x00P" // book.lua's FAIR_P: the end of the places handed out
)

// modelFair is book.lua's F: the tenant being booked.
type modelFair struct {
	tenant                      string
	w, last, gate, wo, exp, len float64
	W, Wo, J, Jo, P, Po         float64
}

// modelNum is Lua's tonumber of a field the scripts wrote with '%d'.
func modelNum(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		panic(fmt.Sprintf("model: %q: %v", s, err))
	}
	return v
}

// fairRecord splits a tenant's record "F,G,w,E".
func fairRecord(rec string) (last, gate, w, exp float64) {
	f := strings.Split(rec, ",")
	if len(f) != 4 {
		panic(fmt.Sprintf("model: tenant record %q", rec))
	}
	return modelNum(f[0]), modelNum(f[1]), modelNum(f[2]), modelNum(f[3])
}

// hget mirrors HGET on a string hash.
func (c *modelCall) hget(k modelKey, field string) (string, bool) {
	e := c.get(k)
	if e == nil {
		return "", false
	}
	v, ok := e.s[field]
	return v, ok
}

// hdel mirrors HDEL on a string hash.
func (c *modelCall) hdel(k modelKey, field string) {
	if e := c.get(k); e != nil {
		delete(e.s, field)
		c.dropIfEmpty(k, e)
	}
}

// zrem mirrors ZREM.
func (c *modelCall) zrem(k modelKey, member string) {
	if e := c.get(k); e != nil {
		delete(e.z, member)
		c.dropIfEmpty(k, e)
	}
}

// zupTo mirrors ZRANGEBYSCORE k -inf max LIMIT 0 n: members by score, then
// by member (bytewise, as Go compares strings).
func (c *modelCall) zupTo(k modelKey, max float64, n int) []string {
	e := c.get(k)
	if e == nil {
		return nil
	}
	var ms []string
	for m, s := range e.z {
		if s <= max {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b string) int {
		if e.z[a] != e.z[b] {
			if e.z[a] < e.z[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return ms[:min(n, len(ms))]
}

// fairRead mirrors fair_read: the tenant's state on bucket t, waiting from
// now on, with the tenants that stopped waiting (8 at most) pruned from W.
func (c *modelCall) fairRead(t *modelTake, tenant string, w, length float64) *modelFair {
	now := c.now
	rec, hasRec := c.hget(t.fair, tenant)
	ws, hasW := c.hget(t.fair, modelFairW)
	W := 0.0
	if hasW {
		W = modelNum(ws)
	}
	Wo := W
	f := &modelFair{tenant: tenant, w: w, gate: now, len: length}
	if js, ok := c.hget(t.fair, modelFairJ); ok {
		f.J = modelNum(js)
	}
	if ps, ok := c.hget(t.fair, modelFairP); ok {
		f.P = modelNum(ps)
	}
	f.Jo, f.Po = f.J, f.P
	if hasRec {
		if a, b, wo, e := fairRecord(rec); e > now {
			f.last, f.gate, f.wo, f.exp = a, b, wo, e
			f.w = wo // a waiting tenant's weight changes by a reweigh only
		} else {
			W = W - wo // its own weight from an earlier wait
			c.hdel(t.fair, tenant)
			c.zrem(t.tenants, tenant)
		}
	}
	if W > f.wo {
		for _, m := range c.zupTo(t.tenants, now, 8) {
			if r, ok := c.hget(t.fair, m); ok {
				_, _, wm, _ := fairRecord(r)
				W = W - wm
			}
			c.hdel(t.fair, m)
			c.zrem(t.tenants, m)
		}
	}
	if W != Wo {
		c.get(t.fair).s[modelFairW] = modelInt(W)
	}
	f.Wo = W
	W = W - f.wo + f.w
	if W < f.w {
		W = f.w
	}
	f.W = W
	return f
}

// stride mirrors fair_stride: the µs a slot of length moves the tenant's
// gate and line.
func (f *modelFair) stride(length float64) float64 { return math.Ceil(length * f.W / f.w) }

// again mirrors again: where a task back from its place (placed) is placed
// again, no further back than the end of every place handed out.
func (f *modelFair) again(placed bool, line float64) float64 {
	if placed && f.P > 0 && f.P < line {
		return f.P
	}
	return line
}

// line mirrors fair_line: the tenant's next place, a stride after its last
// (0: it has none).
func (f *modelFair) line() float64 {
	if f.last == 0 {
		return 0
	}
	return f.last + f.stride(f.len)
}

// fairWrite mirrors fair_write.
func (c *modelCall) fairWrite(t *modelTake, f *modelFair, force bool) {
	now := c.now
	e, due := math.Max(math.Max(f.last, f.gate), now), false
	if e > f.exp-modelFairPad/2 {
		f.exp, force, due = e+modelFairPad, true, true
	}
	rec := modelInt(f.last) + "," + modelInt(f.gate) + "," + modelInt(f.w) + "," + modelInt(f.exp)
	if force || f.W != f.Wo || f.J != f.Jo || f.P != f.Po {
		h := c.getOrCreate(t.fair)
		h.s[f.tenant] = rec
		if f.W != f.Wo {
			h.s[modelFairW] = modelInt(f.W)
		}
		if f.J != f.Jo {
			h.s[modelFairJ] = modelInt(f.J)
		}
		if f.P != f.Po {
			h.s[modelFairP] = modelInt(f.P)
		}
	}
	if due {
		c.getOrCreate(t.tenants).z[f.tenant] = f.exp
		c.extend(t.tenants, f.exp-now)
		c.extend(t.fair, f.exp-now)
	}
}

// inPlace mirrors in_place: place q in the tenant's line (if it starts the
// line, join, no earlier than the join cursor); or, past the deadline,
// expired. Nothing of the task is noted: its caller keeps that it is in
// line (Booking.Back).
func (c *modelCall) inPlace(r Request, t *modelTake, f *modelFair, q, length, deadline float64, join bool, dec func(bool, int, int, float64) Decision, bi int) Decision {
	now := c.now
	if join {
		q = math.Max(q, f.J)
	}
	d := dec(false, bi, 0, q-now)
	if deadline > 0 && q > deadline {
		c.m.fair["expired in place"]++
		d.Outcome = Expired
		return d
	}
	if join {
		f.J = q + length
	}
	f.last = q
	f.P = math.Max(f.P, q+length)
	c.fairWrite(t, f, true)
	d.Outcome, d.Ahead = Placed, int(math.Floor((q-now)/length))
	return d
}

// noteTenantsLost counts, as k (a bucket's tenants hash or their expiry
// set, e) expires, the tenants it holds as waiting: fair_write makes both
// live as long as the longest wait they hold, so none should be.
func (c *modelCall) noteTenantsLost(k modelKey, e *modelEntry) {
	switch k.kind {
	case "w":
		for f, rec := range e.s {
			if f == modelFairW || f == modelFairJ || f == modelFairP {
				continue
			}
			if _, _, _, exp := fairRecord(rec); exp > c.now {
				c.m.lost["w"]++
			}
		}
	case "t":
		for _, exp := range e.z {
			if exp > c.now {
				c.m.lost["t"]++
			}
		}
	}
}
