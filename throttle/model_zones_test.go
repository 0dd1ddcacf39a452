package throttle

import (
	"fmt"
	"math"
)

// The model of calendar quotas and quiet hours (rules.lua's cal_* and
// quiet_*, book.lua's entry_* and cal_earliest).

// calIndex mirrors cal_index, 0-based.
func calIndex(t *modelTake, x float64) (int, bool) {
	b := t.bounds
	if x < b[0] || x >= b[len(b)-1] {
		return 0, false
	}
	i := 0
	for b[i+1] <= x {
		i++
	}
	return i, true
}

func calNow(t *modelTake, now float64) int {
	i, ok := calIndex(t, now)
	if !ok {
		panic(fmt.Sprintf("model: calendar bounds do not hold %v", now))
	}
	return i
}

// calCount mirrors cal_count: the entries in window i.
func (c *modelCall) calCount(t *modelTake, i int) float64 {
	n := 0.0
	if e := c.get(t.key); e != nil {
		for _, s := range e.z {
			if s >= t.bounds[i] && s < t.bounds[i+1] {
				n++
			}
		}
	}
	return n
}

// calCheck mirrors cal_check.
func (c *modelCall) calCheck(t *modelTake, id string, span float64) {
	now := c.now
	i := calNow(t, now)
	s, has := c.zscore(t.key, id)
	mine := has && s >= t.bounds[i]
	j, ok := calIndex(t, now+span)
	if !ok {
		j = len(t.bounds) - 2
	}
	t.ok, t.delay, t.remaining = true, 0, math.Inf(1)
	for w := i; w <= j; w++ {
		n := c.calCount(t, w)
		left := t.limit - n
		if !mine {
			if n+t.cost > t.limit {
				t.ok, t.delay = false, t.bounds[w+1]-now
			} else {
				left -= t.cost
			}
		}
		t.remaining = math.Min(t.remaining, left)
	}
	if mine {
		t.repeated, t.wait = true, math.Max(0, s-now)
	}
}

// calHeld mirrors cal_held.
func (c *modelCall) calHeld(t *modelTake, id string) (float64, bool) {
	s, ok := c.zscore(t.key, id)
	if ok && s >= t.bounds[calNow(t, c.now)] {
		return s, true
	}
	return 0, false
}

// calCommit mirrors cal_commit (scores are whole µs: "(b" is "<= b-1").
func (c *modelCall) calCommit(t *modelTake, id string, at float64) {
	c.zremrangebyscore(t.key, t.bounds[calNow(t, c.now)]-1)
	e := c.getOrCreate(t.key)
	for _, mem := range modelMembers(id, t.cost) {
		e.z[mem] = at
	}
	j, ok := calIndex(t, at)
	if !ok {
		j = len(t.bounds) - 2
	}
	c.extend(t.key, t.bounds[j+1]-c.now)
}

// calUndo mirrors cal_undo.
func (c *modelCall) calUndo(t *modelTake, id string) bool {
	if _, ok := c.calHeld(t, id); !ok {
		return false
	}
	e := c.get(t.key)
	for _, mem := range modelMembers(id, t.cost) {
		delete(e.z, mem)
	}
	c.dropIfEmpty(t.key, e)
	return true
}

// quietEnd mirrors quiet_end: the end of the span holding x.
func quietEnd(t *modelTake, x float64) (float64, bool) {
	for j := 0; j < len(t.spans); j += 2 {
		if x < t.spans[j] {
			return 0, false
		}
		if x < t.spans[j+1] {
			return t.spans[j+1], true
		}
	}
	return 0, false
}

// quietCheck mirrors quiet_check.
func (c *modelCall) quietCheck(t *modelTake, span float64) {
	now := c.now
	if now < t.from || now >= t.until {
		panic(fmt.Sprintf("model: quiet hours do not cover %v", now))
	}
	t.ok, t.delay, t.remaining = true, 0, math.Inf(1)
	for j := 0; j < len(t.spans); j += 2 {
		if t.spans[j] > now+span {
			break
		}
		if t.spans[j+1] > now {
			t.ok, t.delay = false, t.spans[j+1]-now
			return
		}
	}
}

// entryHeld mirrors entry_held.
func (c *modelCall) entryHeld(t *modelTake, id string) (float64, bool) {
	switch t.kind {
	case "q":
		if s, ok := c.zscore(t.key, id); ok && s > c.now-t.longest {
			return s, true
		}
	case "c":
		return c.calHeld(t, id)
	}
	return 0, false
}

// calEarliest mirrors cal_earliest.
func (c *modelCall) calEarliest(t *modelTake, floor float64) (float64, bool) {
	m := floor
	if z := c.zdesc(t.key); len(z) > 0 && z[0] > m {
		m = z[0]
	}
	i, ok := calIndex(t, m)
	if !ok || c.calCount(t, i)+t.cost <= t.limit {
		return m, false
	}
	return t.bounds[i+1], true
}

func (c *modelCall) earliest(t *modelTake, floor float64) float64 {
	if t.kind == "c" {
		m, _ := c.calEarliest(t, floor)
		return m
	}
	m, _ := c.quotaEarliest(t, floor)
	return m
}

// calFits mirrors cal_fits.
func (c *modelCall) calFits(t *modelTake, id string, x float64) bool {
	i, ok := calIndex(t, x)
	if !ok {
		return false
	}
	n := c.calCount(t, i)
	if s, ok := c.zscore(t.key, id); ok && s >= t.bounds[i] && s < t.bounds[i+1] {
		n -= t.cost
	}
	return n+t.cost <= t.limit
}

func (c *modelCall) fitsAt(t *modelTake, id string, x float64, book *modelKey, slack float64) bool {
	if t.kind == "c" {
		return c.calFits(t, id, x)
	}
	return c.quotaFits(t, id, x, book, slack)
}

func (c *modelCall) entryCommit(t *modelTake, id string, x float64) {
	if t.kind == "c" {
		c.calCommit(t, id, x)
		return
	}
	c.quotaCommit(t, id, x)
}

func (c *modelCall) entryMove(t *modelTake, id string, x float64) {
	if t.kind != "c" {
		c.quotaMove(t, id, x)
		return
	}
	e := c.get(t.key)
	for _, mem := range modelMembers(id, t.cost) {
		if _, ok := e.z[mem]; ok {
			e.z[mem] = x
		}
	}
	j, ok := calIndex(t, x)
	if !ok {
		j = len(t.bounds) - 2
	}
	c.extend(t.key, t.bounds[j+1]-c.now)
}

func (c *modelCall) entryUndo(t *modelTake, id string) bool {
	if t.kind == "c" {
		return c.calUndo(t, id)
	}
	return c.quotaUndo(t, id)
}

// beyond mirrors book.lua's beyond, 1-based (0: none).
func beyond(takes []*modelTake, m float64) int {
	for i, t := range takes {
		if t.kind == "c" && m >= t.bounds[len(t.bounds)-1] || t.kind == "h" && m >= t.until {
			return i + 1
		}
	}
	return 0
}
