-- book.lua (after rules.lua, before admit.lua): booking, the steps of the
-- book entry point (admit.lua) for a task that may not go within its max
-- wait. The model (what a booking holds, claims, lines and shares, why) is
-- docs/booking.md's; this file says how each step is built. On a Redis
-- Cluster the same steps run on each node's part of the request, with a
-- floor (throttle/cluster.go; docs/booking.md, "On a Redis Cluster").
--
-- A plan that books has quotas and at most one bucket (throttle.Request
-- checks that). It holds, on each quota, the task's entry at the booked
-- moment x; on the bucket, a slot in its calendar (see rules.lua) and a
-- ticket (member: the task ID, score: the slot's start V). Claims, late
-- tasks, priority bumps and deadlines: docs/booking.md, "Booking a moment
-- (lua/book.lua)" and "Priority".
--
-- A ticket's member is the task ID, followed by \30 and the cost when the
-- cost is not 1 (so that a priority task that moves it knows its length).
-- Tickets nobody claimed (a task deleted while booked) stay for GRACE after
-- their moment at most: each booking prunes the older ones. Their slots are
-- lost, one each.

local GRACE = 600000000 -- µs: 10 minutes

-- CLAIM is how far ahead of its moment a booked task may claim it, whatever
-- its max wait: asynq wakes a deferred task up to a second either side of
-- the moment asked for, so a booked task asks to be woken 1.5 s early
-- (jobs.wakeEarly) and must be let claim from 2.5 s before its moment. A
-- claim window tied to max wait made a max wait under 2 s wake half the
-- booked tasks after their slot, each then booking again at the line's end.
local CLAIM = 2500000 -- µs

-- Outcomes, the first value of a task's reply (see admit.lua), numbered as
-- throttle.Outcome numbers them.
local DENIED, ADMITTED, REPEATED, BOOKED, REBOOKED, PLACED, EXPIRED, DONE = 0, 1, 2, 3, 4, 5, 6, 7

-- reply is a task's answer: its values in the order admit.lua's header
-- gives.
local function reply(outcome, binding, window, fresh, now, delay, remaining, extra)
  return {outcome, binding, window, fresh, now, delay, remaining, extra, 0, 0}
end

-- ticket_member is the task's member in a bucket's tickets.
local function ticket_member(id, cost)
  if cost == 1 then return id end
  return id .. '\30' .. int(cost)
end

-- ticket_cost reads a ticket member's cost.
local function ticket_cost(member)
  local c = find(member, '\30', 1, true)
  if c then return tonum(sub(member, c + 1)) end
  return 1
end
-- quota_earliest returns the earliest moment, not before floor, at which a
-- new entry of the task fits every window of quota t after the entries
-- already in it: after the newest one, and after the entry whose leaving
-- makes room in each window (the (limit - cost + 1)-th newest leaves at its
-- score + per). It also returns the window that set it (0: none).
local function quota_earliest(t, key, floor_)
  local m, mw, nw, cost = floor_, 0, t.nw, t.cost
  if t.most <= QREAD then
    local z = rcall('ZREVRANGE', key, '0', int(t.most - cost), 'WITHSCORES')
    if #z == 0 then return m, 0 end
    local newest = tonum(z[2])
    if newest > m then m = newest end
    for w = 1, nw do
      local s = z[2 * (t[w] - cost + 1)]
      if s then
        s = tonum(s) + t[nw + w]
        if s >= m then m, mw = s, w end
      end
    end
    return m, mw
  end
  local z = rcall('ZREVRANGE', key, '0', '0', 'WITHSCORES')
  if #z == 0 then return m, 0 end
  local newest = tonum(z[2])
  if newest > m then m = newest end
  for w = 1, nw do
    local i = int(t[w] - cost)
    z = rcall('ZREVRANGE', key, i, i, 'WITHSCORES')
    if z[2] then
      local s = tonum(z[2]) + t[nw + w]
      if s >= m then m, mw = s, w end
    end
  end
  return m, mw
end

-- mine reports whether a quota member is one of the task's (see members).
local function mine(member, id)
  return member == id or sub(member, 1, #id + 1) == id .. '\31'
end

-- slot_of returns, for the task of a quota member that has not claimed
-- yet, the start of the slot its ticket in book holds (nil: none, or no
-- book). Only a ticket of cost 1 is looked for (its member is the ID).
local function slot_of(book, member)
  if not book then return nil end
  return tonum(rcall('ZSCORE', book, match(member, '^([^\31]*)')))
end

-- quota_fits reports whether the task's entry, moved to x, fits every
-- window of quota t given every other entry, earlier or later: for each
-- window of length P, every window (s - P, s] that would hold x (s from x
-- to x + P) holds at most limit - cost others. The count only grows at an
-- entry, so s = x and s = each other entry in [x, x + P) are the windows to
-- count. A task that has not claimed yet (its ticket in book; nil: none)
-- counts where it will go: at its entry or, if later, its slot's start
-- less slack, so that a recipient's line moved by a pause still fits
-- (docs/booking.md, "A provider's pause"; counted at their old moments,
-- a 1 s pause emptied 20 s of sends). A large quota is not read: it fits
-- while its whole set holds no more than its least limit.
local function quota_fits(t, key, id, x, book, slack)
  if t.most > QREAD then
    -- Too many to read: its entries fit anywhere while the whole set,
    -- theirs included, holds no more than the least limit (a quota far
    -- from its limit, as one of 1,000 an hour mostly is).
    local least = t[1]
    for w = 2, t.nw do least = min(least, t[w]) end
    return rcall('ZCARD', key) <= least
  end
  local lo, hi = fmt('(%.17g', x - t.longest), fmt('(%.17g', x + t.longest)
  local z = rcall('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', '0', int(4 * QREAD))
  if #z >= 8 * QREAD then return false end
  local sc, n = {}, 0 -- the other tasks' scores
  for j = 1, #z, 2 do
    if not mine(z[j], id) then
      n = n + 1
      sc[n] = tonum(z[j + 1])
      local v = slot_of(book, z[j])
      if v and v - slack > sc[n] then sc[n] = v - slack end
    end
  end
  local nw = t.nw
  for w = 1, nw do
    local room, per = t[w] - t.cost, t[nw + w]
    for j = 0, n do
      local s = x
      if j > 0 then s = sc[j] end
      if s >= x and s < x + per then
        local c = 0
        for i = 1, n do
          if sc[i] > s - per and sc[i] <= s then c = c + 1 end
        end
        if c > room then return false end
      end
    end
  end
  return true
end

-- quota_move moves the task's entries on quota t to x.
local function quota_move(t, key, id, now, x)
  local m, zargs = members(id, t.cost), {'XX'}
  for i = 1, #m do
    zargs[2 * i], zargs[2 * i + 1] = int(x), m[i]
  end
  rcall('ZADD', key, unpack_(zargs))
  extend(key, ceil_ms(x - now + t.longest))
end

-- A booking's other rules (see rules.lua): calendar quotas and quiet hours.
-- A moment set by a quiet span's end or a calendar window's start is
-- shared: every subject of the zone may be held for it. The provider's
-- calendar places the bookings for it one free slot after another (so the
-- morning after quiet hours is paced by the provider, in order, not a
-- stampede).

-- entry_held returns the moment of the task's counting entry on a quota or
-- calendar take, else nil.
local function entry_held(t, key, id, now)
  if t.kind == 'q' then
    local s = rcall('ZSCORE', key, id)
    s = s and tonum(s)
    if s and s > now - t.longest then return s end
  elseif t.kind == 'c' then
    return cal_held(t, key, id, now)
  end
  return nil
end

-- cal_earliest returns the earliest moment, not before floor nor before
-- the newest entry (a subject's entries are booked in order), at which a
-- new entry fits calendar quota t: that moment if its window has room, else
-- the next window's start (empty: no entry is later than the newest); and
-- whether it is a window's start.
local function cal_earliest(t, key, floor_)
  local m = floor_
  local z = rcall('ZREVRANGE', key, '0', '0', 'WITHSCORES')
  if z[2] and tonum(z[2]) > m then m = tonum(z[2]) end
  local i = cal_index(t, m)
  if not i or cal_count(t, key, i) + t.cost <= t.limit then return m, false end
  return t[i + 1], true
end

-- earliest is quota_earliest or cal_earliest's moment.
local function earliest(t, key, floor_)
  if t.kind == 'c' then return (cal_earliest(t, key, floor_)) end
  return (quota_earliest(t, key, floor_))
end

-- cal_fits reports whether the task's entries, moved to x, fit x's window.
local function cal_fits(t, key, id, x)
  local i = cal_index(t, x)
  if not i then return false end
  local c = cal_count(t, key, i)
  local s = rcall('ZSCORE', key, id)
  if s and tonum(s) >= t[i] and tonum(s) < t[i + 1] then c = c - t.cost end
  return c + t.cost <= t.limit
end

local function fits_at(t, key, id, x, book, slack)
  if t.kind == 'c' then return cal_fits(t, key, id, x) end
  return quota_fits(t, key, id, x, book, slack)
end

-- entry_commit adds the task's entries at x on a quota or calendar take;
-- entry_move moves them there; entry_undo gives them back.
local function entry_commit(t, key, id, now, x)
  if t.kind == 'c' then return cal_commit(t, key, id, now, x) end
  return quota_commit(t, key, id, now, x, nil, nil)
end

local function entry_move(t, key, id, now, x)
  if t.kind ~= 'c' then return quota_move(t, key, id, now, x) end
  local m, zargs = members(id, t.cost), {'XX'}
  for i = 1, #m do
    zargs[2 * i], zargs[2 * i + 1] = int(x), m[i]
  end
  rcall('ZADD', key, unpack_(zargs))
  extend(key, ceil_ms(t[(cal_index(t, x) or t.nb - 1) + 1] - now))
end

local function entry_undo(t, key, id, now)
  if t.kind == 'c' then return cal_undo(t, key, id, now) end
  return quota_undo(t, key, id, now)
end

-- beyond returns the index of a calendar or quiet take whose plan does not
-- reach moment m, or nil: such a moment is not booked (the task is told to
-- come back then, when its plan will reach further).
local function beyond(p, m)
  for i = 1, p.n do
    local t = p[i]
    if t.kind == 'c' and m >= t[t.nb] or t.kind == 'h' and m >= t.til then return i end
  end
  return nil
end

-- ticket_add books slot v of length len on a bucket for the task: the
-- calendar marks it busy and the tickets hold it. Tickets past GRACE go.
local function ticket_add(book, cal, member, now, v, len, left, ra, rb, keep)
  bucket_add(cal, now, v, len, left, ra, rb, keep)
  rcall('ZREMRANGEBYSCORE', book, '-inf', int(now - GRACE))
  bucket_hold(book, member, now, v, 0, GRACE)
end

-- ticket_claim moves a booked slot v from the tickets to the ledger: its
-- task is in flight.
local function ticket_claim(book, cal, member, id, v)
  rcall('ZREM', book, member)
  ledger_hold(cal, id, v)
end

-- bump moves ticket member, whose slot starts at s (a priority task takes
-- that slot, of len µs), to the first free slot after it. It returns s, or
-- nil: the slot is shorter than len, or nothing is free.
local function bump(bt, book, cal, now, member, s, len, keep)
  local vlen = ceil(ticket_cost(member) * 1e6 / bt.rate)
  if vlen < len then return nil end
  local v, left, ra, rb = bucket_find(cal, s, vlen)
  if not v then return nil end
  bucket_add(cal, now, v, vlen, left, ra, rb, keep)
  bucket_hold(book, member, now, v, 0, GRACE)
  return s
end

-- BUMP_MARGIN: a claimed slot is taken from its task only while the task
-- is still asleep for at least this long (it checks its slot before it
-- sends: throttle.Limiter.HasSlot).
local BUMP_MARGIN = 50000 -- µs

-- PRIO_SOON: a priority task that would wait longer than this (or its max
-- wait, if shorter) takes a booked or claimed slot ahead of its own.
local PRIO_SOON = 200000 -- µs

-- bump_claimed takes the first claimed slot (in the ledger: its task sleeps
-- until it) that starts before before and whose task goes no earlier than
-- BUMP_MARGIN from now whatever its slack, for a priority task of cost 1:
-- the task loses it (its ledger entry goes) and finds out before it sends;
-- the slot stays busy, now the priority task's. It returns the slot, or nil.
local function bump_claimed(bt, cal, now, from, before)
  if bt.cost ~= 1 then return nil end
  -- The most slack a take of cost 1 has (a priority one's): its task
  -- sleeps at least until its slot's start less that.
  local lo = max(from, now + BUMP_MARGIN + max(0, floor((bt.burst - 1) * 1e6 / bt.rate)))
  if lo >= before then return nil end
  -- Ledger entries score -V: the first slot from lo is the highest score.
  local z = rcall('ZREVRANGEBYSCORE', cal, int(-lo), '(' .. int(-before), 'WITHSCORES', 'LIMIT', '0', '1')
  if #z == 0 then return nil end
  rcall('ZREM', cal, z[1])
  return -tonum(z[2])
end

-- take_ahead takes, for a priority task of slot len, the earliest of: the
-- slot of the first claimed task that still sleeps (bump_claimed) and that
-- of the first booking not yet claimed (bump), before slot v. It returns
-- the slot taken, or nil.
local function take_ahead(bt, book, cal, now, from, v, len, keep)
  local z = rcall('ZRANGEBYSCORE', book, int(from), '(' .. int(v), 'WITHSCORES', 'LIMIT', '0', '1')
  local c = bump_claimed(bt, cal, now, from, tonum(z[2]) or v)
  if c or #z == 0 then return c end
  return bump(bt, book, cal, now, z[1], tonum(z[2]), len, keep)
end

-- Fair shares and the horizon: stride scheduling per tenant (gate G,
-- stride len * W / w), places in line past the horizon H (plan 'k:H') one
-- stride after the tenant's last place F, first places no earlier than the
-- join cursor J. Why and what it guarantees: docs/booking.md, "Fair shares
-- between tenants" and "Places in line: the horizon". Nothing is held for a
-- task in line: its caller keeps that it is in line (throttle.Booking.Back).
-- A moment past the horizon set by a recipient's quota, not the bucket, is
-- not the bucket's line: it holds its slot and leaves the tenant's gate and
-- line alone.
--
-- Per bucket, the tenants hash holds, for each waiting tenant, "F,G,w,E" (F:
-- its last place, 0 for none; E: when it stops waiting, as the expiry set
-- has it), under '\0W' W, the sum of the weights recorded, under '\0J'
-- the join cursor, and under '\0P' the end of the places handed out. A
-- tenant waits while E > now; E is the later of its gate and its last
-- place, plus FAIR_PAD, written at most once per FAIR_PAD (not its line's
-- next place: with many tenants that is many slots on, and a tenant with
-- nothing more in line would weigh in W, and keep its record, that long).
-- A tenant that stops waiting leaves W when the expiry set shows it (read
-- only when W holds more than the tenant's own weight), or when it comes
-- back, and its record goes: memory follows the tenants waiting.

local FAIR_PAD = 1000000 -- µs
local FAIR_W, FAIR_J, FAIR_P = '\0W', '\0J', '\0P'

-- fair_read loads tenant's state on a bucket (fair: tenants hash, exp: the
-- expiry set; w its weight in the config, which the record of a tenant
-- already waiting overrides; len the bucket's slot) and returns it, the
-- tenant waiting from now on: a table the line and gate steps below read
-- and move, and fair_write stores. Its fields: tenant, w, len; last (its
-- last place, 0: none), gate, wo (the weight its record holds), exp (its
-- record's expiry); W (the weights waiting, its own included) and Wo (as
-- read); J and P (the join cursor and the end of places), Jo and Po as read.
local function fair_read(fair, exp, tenant, w, now, len)
  local r = rcall('HMGET', fair, tenant, FAIR_W, FAIR_J, FAIR_P)
  local W = tonum(r[2]) or 0
  local Wo = W
  local f = {tenant = tenant, w = w, last = 0, gate = now, wo = 0, exp = 0, len = len}
  f.J, f.P = tonum(r[3]) or 0, tonum(r[4]) or 0
  f.Jo, f.Po = f.J, f.P
  if r[1] then
    local a, b, c, e = match(r[1], '^(%d+),(%d+),(%d+),(%d+)$')
    if tonum(e) > now then
      f.last, f.gate, f.wo, f.exp = tonum(a), tonum(b), tonum(c), tonum(e)
      -- A waiting tenant keeps the weight its line was laid out at until a
      -- reweigh (repace.lua) scales the line to another: a job routed with
      -- a weight changed in the config must not write it here first, or
      -- the reweigh that follows the change finds nothing to scale, and
      -- the places handed out keep the old shares.
      f.w = f.wo
    else
      -- Its own weight from an earlier wait leaves W here, not only if the
      -- prune below reaches it: its record is written anew, out of that
      -- prune's reach, and the old weight would stay in W for good.
      W = W - tonum(c)
      rcall('HDEL', fair, tenant)
      rcall('ZREM', exp, tenant)
    end
  end
  if W > f.wo then
    -- Others count in W: leave out those that stopped waiting.
    local z = rcall('ZRANGEBYSCORE', exp, '-inf', int(now), 'LIMIT', '0', '8')
    for j = 1, #z do
      local m = z[j]
      local rec = rcall('HGET', fair, m)
      if rec then W = W - tonum(match(rec, '^%d+,%d+,(%d+),')) end
      rcall('HDEL', fair, m)
      rcall('ZREM', exp, m)
    end
  end
  if W ~= Wo then
    -- The records pruned are gone whatever this call does next (it may
    -- write nothing more: a task expired at its place, say): so is their
    -- weight.
    rcall('HSET', fair, FAIR_W, int(W))
  end
  f.Wo = W
  W = W - f.wo + f.w
  if W < f.w then W = f.w end
  f.W = W
  return f
end

-- fair_others reports whether tenants other than f's wait: only then does
-- its gate hold it back.
local function fair_others(f)
  return f.W > f.w
end

-- fair_stride is the µs a slot of len moves the tenant's gate and line.
local function fair_stride(f, len)
  return ceil(len * f.W / f.w)
end

-- fair_line is where the tenant's next place would be: a stride after its
-- last one (0: it has none).
local function fair_line(f)
  if f.last == 0 then return 0 end
  return f.last + fair_stride(f, f.len)
end

-- fair_start is where a tenant held by its gate looks for a slot: the gate,
-- or the end of the busy span just before it when that is less than a slot
-- before the gate (a slot at the gate would leave a gap no slot fits: with
-- a stride of 1.5 slots, every other one).
local function fair_start(cal, m, gate, len)
  local s = max(m, gate)
  if gate <= m then return s end
  local z = rcall('ZREVRANGEBYSCORE', cal, int(s), '-inf', 'WITHSCORES', 'LIMIT', '0', '1')
  local e = tonum(z[2])
  if e and e > s - len and e >= m then s = e end
  return s
end

-- fair_take moves the tenant's gate past slot v by its stride: from where
-- the gate was, so that strides of fractions of a slot add up, unless the
-- slot is more than a slot past it (the tenant waited for others, or was
-- idle): then from a slot before the slot, so that the tenant keeps at
-- most one slot of credit.
local function fair_take(f, v, len)
  f.gate = max(f.gate, v - len) + fair_stride(f, len)
end

-- fair_write stores f back when it changed (force: its line or gate did),
-- or when the tenant's expiry is due to be pushed on.
local function fair_write(f, fair, exp, now, force)
  local e, due = max(f.last, f.gate, now), false
  if e > f.exp - FAIR_PAD / 2 then f.exp, force, due = e + FAIR_PAD, true, true end
  local set = {fair, f.tenant, fmt('%d,%d,%d,%d', f.last, f.gate, f.w, f.exp)}
  if f.W ~= f.Wo then set[#set + 1], set[#set + 2] = FAIR_W, int(f.W) end
  if f.J ~= f.Jo then set[#set + 1], set[#set + 2] = FAIR_J, int(f.J) end
  if f.P ~= f.Po then set[#set + 1], set[#set + 2] = FAIR_P, int(f.P) end
  if force or #set > 3 then rcall('HSET', unpack_(set)) end
  if due then
    -- Both keys live as long as the longest wait they hold (W with them).
    rcall('ZADD', exp, int(f.exp), f.tenant)
    extend(exp, ceil_ms(f.exp - now))
    extend(fair, ceil_ms(f.exp - now))
  end
end

-- fair_took records that the tenant took slot v: a tenant alone is not
-- held by its gate, which is kept only while others wait (so that a slot
-- given back is the next booking's, whoever's).
local function fair_took(f, fair, exp, now, v, len)
  local others = fair_others(f)
  if others then fair_take(f, v, len) end
  fair_write(f, fair, exp, now, others)
end

-- behind reports whether a task back from its place (q: the later of its
-- place and its tenant's gate; false: not back from a place), whose first
-- free slot lets it go at m, finds the calendar behind the line: its slot
-- more than a slot past q (a gate ahead of its place is its share, not the
-- calendar: it books there), and not one it can go to now (within
-- maxwait; with none, every booking is a ticket and nothing is saved). Tasks
-- back late (after a long first pass), or priority ones, took the slots of
-- the places. A ticket would cost the task a second call and keep the
-- calendar behind for every task after it; a new place, at its line's end,
-- costs one, once, and the tasks after it find their slots free.
local function behind(q, m, now, maxwait, len)
  return q and maxwait > 0 and m > now + maxwait and m > q + len
end

-- again is where a task back from its place q (false: none) is placed
-- again in its tenant's line, line: no further back than the end of every
-- place handed out (P). A tenant's line runs on at its share (with 10,000
-- tenants waiting, a stride is 10,000 slots), but a task placed again needs
-- only a place behind those handed out, whoever's: there the calendar has
-- room.
local function again(f, q, line)
  if q and f.P > 0 and f.P < line then return f.P end
  return line
end

-- line_enter is what a task's line says before a slot is sought (f its
-- tenant, a horizon H, back whether the task is back from a place in it):
-- 'end' and the line's end for a task new to a tenant whose line reaches
-- past the horizon; else nil and, for a task back from its place, now (it
-- was woken at its place: its slot is sought from there, behind the tasks
-- placed before it; false for a task not in line).
local function line_enter(f, back, now, H)
  if back then return nil, now end
  if fair_line(f) > now + H then return 'end', fair_line(f) end
  return nil, false
end

-- sleep_limit is how long before its moment a task may go and sleep in its
-- worker for it: its max wait; back from a place, at least CLAIM, as a
-- ticket may be claimed (it was woken for that slot, up to two seconds
-- early: a ticket instead would wake it a second time); or, when work its
-- caller has not seen waits behind it (the plan's 'u') and it is not back
-- from a place, not at all: it books its moment (a ticket, or a place past
-- the horizon) and the worker moves on to the work behind it, so that a
-- tenant queued after another's backlog is seen, and served its share, at
-- once.
local function sleep_limit(p, back)
  if back then return max(p.maxwait, CLAIM) end
  if p.unseen then return 0 end
  return p.maxwait
end

-- line_exit is, after a slot that lets the task go at m was found (gate: its
-- tenant's gate, its place included; H the horizon), the place it
-- takes instead, and whether that starts its line (join), or nil: it takes
-- the slot. It takes a place when m is past the horizon or, back from its
-- place, it finds the calendar behind the line (see behind).
local function line_exit(f, back, gate, m, now, H, maxwait, len)
  if m <= now + H and not behind(back and gate, m, now, maxwait, len) then return nil end
  local line = fair_line(f)
  return max(m, again(f, back, line)), line <= now + H
end

-- line_place gives a task place q in its tenant's line, or, if it starts
-- the line (join), the join cursor's place when that is later. It returns
-- the place, and false if that is past the deadline (µs, 0: none): then
-- nothing is written.
local function line_place(f, fair, fexp, now, q, len, deadline, join)
  if join then q = max(q, f.J) end
  if deadline > 0 and q > deadline then return q, false end
  if join then f.J = q + len end
  f.last = q
  if q + len > f.P then f.P = q + len end
  fair_write(f, fair, fexp, now, true)
  return q, true
end

-- A booking (book_task) is decided in steps, each a function below, on a
-- table b of what it knows of the task (booking_of): its plan p, ID, now,
-- deadline, weight, tenant; for each take i its first
-- key's index at[i] and the moment of the entry it holds held[i] (false:
-- none); and, for its bucket take (bi, bt), the bucket's keys (state,
-- book, cal, fair, fexp), the slot's length len, the task's slack
-- and its ticket's member. k is the index past the task's last key, which
-- every reply returns. base is the earliest moment it may have: now, or on
-- a cluster the floor the other node's part of the request set (see
-- throttle/cluster.go); back says it is back from a place in its tenant's
-- line.

-- booking_of reads the task's keys (see above); a is its arguments (see
-- the book entry point, admit.lua).
local function booking_of(keys, ki, p, now, a)
  local b = {keys = keys, id = a.id, p = p, now = now, base = max(now, a.floor), deadline = a.deadline,
    weight = a.weight, tenant = a.tenant, back = a.back, at = {}, held = {}}
  local k = ki
  for i = 1, p.n do
    b.at[i] = k
    if p[i].kind == 'b' then
      b.bi, b.bt = i, p[i]
      b.state, b.book, b.cal = keys[k], keys[k + 1], keys[k + 2]
      b.fair, b.fexp = keys[k + 3], keys[k + 4]
    end
    k = k + p[i].nk
  end
  if b.bt then
    b.len, b.slack, b.member = bucket_len(b.bt), bucket_slack(b.bt, p.prio), ticket_member(a.id, b.bt.cost)
  end
  return b
end

-- key is the first key of the task's take i.
local function key(b, i) return b.keys[b.at[i]] end

-- holdings reads what the task holds: its ticket's slot (nil: none), and
-- each quota or calendar entry (into b.held); it returns the ticket and the
-- latest entry's moment (0: none).
local function holdings(b)
  local ticket, latest = nil, 0
  if b.bt then ticket = tonum(rcall('ZSCORE', b.book, b.member)) end
  for i = 1, b.p.n do
    local s = entry_held(b.p[i], key(b, i), b.id, b.now)
    b.held[i] = s or false
    if s and s > latest then latest = s end
  end
  return ticket, latest
end

-- claim_moment is the moment x a task that holds a booking goes at: its
-- entries' moment or, if later, its slot's start less the slack, and not
-- before a pause ends; booked is the moment it had booked, and late says
-- its slot cannot be used any more: x is past the slot's end. A task back
-- a little late (its worker was busy, Redis slow) goes within its slot,
-- which nobody else can use: every send still uses a slot of its own
-- between the slot's start less the slack and its end, which keeps the
-- bucket's bound (rules.lua).
local function claim_moment(b, ticket, latest)
  local x, booked = max(b.base, latest), latest
  local late = b.bt and not ticket -- its slot was claimed and has ended
  if ticket then
    booked = max(latest, ticket - b.slack)
    x = max(x, booked)
    local pz = tonum(rcall('HGET', b.state, 'p'))
    if pz and pz > x then x = pz end
    if x >= ticket + b.len then late = true end
  end
  return x, booked, late
end

-- claim_fits reports whether every take of the task allows it at x: its
-- entries held fit there (or a fresh one would), and no quiet hours hold x.
local function claim_fits(b, x)
  for i = 1, b.p.n do
    local t = b.p[i]
    if t.count then -- it goes wherever the others let it
    elseif t.kind == 'q' or t.kind == 'c' then
      local s = b.held[i]
      if s then
        if s ~= x and not fits_at(t, key(b, i), b.id, x, b.bt and b.book, b.slack) then return false end
      elseif earliest(t, key(b, i), b.now) > x then
        return false
      end
    elseif t.kind == 'h' and quiet_end(t, x) then
      return false
    end
  end
  return true
end

-- claim_commit makes the task's holdings go at x: its entries move there
-- (or are made), its ticket moves to the ledger. It returns the takes it
-- consumed (admit.lua's fresh).
local function claim_commit(b, x, ticket)
  local fresh, bit = 0, 1
  for i = 1, b.p.n do
    local t = b.p[i]
    if t.kind == 'q' or t.kind == 'c' then
      if not b.held[i] then
        fresh = fresh + bit
        entry_commit(t, key(b, i), b.id, b.now, x)
      elseif b.held[i] ~= x then
        entry_move(t, key(b, i), b.id, b.now, x)
      end
    elseif t.kind == 'h' then
      fresh = fresh + bit
    else
      fresh = fresh + bit
      ticket_claim(b.book, b.cal, b.member, b.id, ticket)
    end
    bit = bit * 2
  end
  return fresh
end

-- give_back gives back what the task holds (its entries, its ticket and
-- the ticket's slot if ahead): it books again.
local function give_back(b, ticket)
  for i = 1, b.p.n do
    if b.held[i] then entry_undo(b.p[i], key(b, i), b.id, b.now) end
  end
  if ticket then
    rcall('ZREM', b.book, b.member)
    bucket_give(b.state, b.cal, ticket, b.len, b.now)
  end
end

-- claim answers a task that holds a booking: early (more than CLAIM and its
-- max wait before its moment), it is told the moment again; in time and
-- still fitting, it goes. It returns the reply's index, or nil when the
-- task is late or no longer fits: it gave back what it held, and books
-- again.
local function claim(b, ticket, latest)
  local now, x, booked, late = b.now, claim_moment(b, ticket, latest)
  if not late and x > now + max(b.p.maxwait, CLAIM) then
    return reply(BOOKED, 0, 0, 0, now, x - now, 0, 0)
  end
  if not late and claim_fits(b, x) then
    local fresh = claim_commit(b, x, ticket)
    return reply(ADMITTED, 0, 0, fresh, now, x - now, 0, booked)
  end
  give_back(b, ticket)
  return nil
end

-- quotas_moment is the earliest moment every quota and calendar take
-- allows a new entry, not before base, the take that sets it (0: none) and
-- the quota's window that does (0: none).
local function quotas_moment(b)
  local m, binding, window = b.base, 0, 0
  for i = 1, b.p.n do
    local t = b.p[i]
    if t.count then -- it sets no moment
    elseif t.kind == 'q' then
      local q, w = quota_earliest(t, key(b, i), b.now)
      if q > m then m, binding, window = q, i, w end
    elseif t.kind == 'c' then
      local q = cal_earliest(t, key(b, i), b.now)
      if q > m then m, binding, window = q, i, 0 end
    end
  end
  return m, binding, window
end

-- quiet_until is where the task's quiet hours (if any) move moment m: the
-- end of the quiet span m is in, and the take that says so; else nil.
local function quiet_until(b, m)
  local by
  for i = 1, b.p.n do
    local e = b.p[i].kind == 'h' and not b.p[i].count and quiet_end(b.p[i], m)
    if e then m, by = e, i end
  end
  if by then return m, by end
  return nil
end

-- in_place gives the task place q in its tenant's line: it comes back
-- then, holding nothing (its caller keeps that it is in line); or, past its
-- deadline, it expires.
local function in_place(b, f, q, join)
  local placed
  q, placed = line_place(f, b.fair, b.fexp, b.now, q, b.len, b.deadline, join)
  if not placed then
    return reply(EXPIRED, b.bi, 0, 0, b.now, q - b.now, 0, 0)
  end
  return reply(PLACED, b.bi, 0, 0, b.now, q - b.now, 0, floor((q - b.now) / b.len))
end

-- share reads the task's tenant on its bucket, where the bucket sets the
-- task's moment (m within the horizon, or none: the tenant's share), and
-- what its line says (line_enter). It returns f (nil: no share: a priority
-- task, no bucket, or a moment the quotas set past the horizon), the gate
-- the slot is sought from, the moment the task is back from its place
-- (false: none), and a reply when the line answers it (it joins the
-- line's end).
local function share(b, m)
  local H = b.p.horizon
  if not b.bt or b.p.prio or H > 0 and m > b.now + H then return nil, 0, false end
  local f = fair_read(b.fair, b.fexp, b.tenant, b.weight, b.now, b.len)
  local gate = fair_others(f) and f.gate or 0
  if H == 0 then return f, gate, false end
  local how, q = line_enter(f, b.back, b.now, H)
  if how == 'end' then
    return f, gate, false, in_place(b, f, max(m, q), false)
  end
  if q and q > gate then gate = q end
  return f, gate, q
end

-- find_slot is the earliest moment, from m, at which the quotas' moment,
-- quiet hours and a free slot of the bucket from the gate on all allow the
-- task, and that slot: {v, left, ra, rb} as bucket_find gives them, taken
-- (a priority task's, taken from a booking: see take_ahead) or nil: no
-- bucket, or the calendar is too fragmented (false, and then how far the
-- search got). binding and window name what set the moment.
local function find_slot(b, m, gate, binding, window)
  local slot
  for _ = 1, 4 do
    local e, i = quiet_until(b, m)
    if e then m, binding, window = e, i, 0 end
    if not b.bt then return m, binding, window, nil end
    local v, left, ra, rb = bucket_find(b.cal, fair_start(b.cal, m, gate, b.len), b.len)
    if not v then return m, binding, window, false, left end
    slot = {v = v, left = left, ra = ra, rb = rb}
    local x = max(m, v - b.slack)
    if b.p.prio and x > b.now + min(b.p.maxwait, PRIO_SOON) then
      local s = take_ahead(b.bt, b.book, b.cal, b.now, max(b.now, m), v, b.len, b.p.remember)
      if s then slot, x = {v = s, taken = true}, max(m, s - b.slack) end
    end
    if x > m then m, binding, window = x, b.bi, 0 end
    if not quiet_until(b, m) then break end
  end
  return m, binding, window, slot
end

-- commit_booking writes the task's holdings at m: its entries, and on its
-- bucket the slot (go: in the ledger, it goes; else a ticket). It returns
-- the takes it consumed.
local function commit_booking(b, m, slot, go)
  local fresh, bit, now, remember = 0, 1, b.now, b.p.remember
  for i = 1, b.p.n do
    local t = b.p[i]
    fresh = fresh + bit
    if t.kind == 'q' or t.kind == 'c' then
      entry_commit(t, key(b, i), b.id, now, m)
    elseif t.kind ~= 'b' then -- holds nothing
    elseif go and not slot.taken then
      bucket_commit(t, b.cal, b.id, now, slot.v, slot.left, slot.ra, slot.rb, remember)
    elseif go then -- a slot taken from a booking: busy already
      ledger_hold(b.cal, b.id, slot.v)
    elseif slot.taken then
      bucket_hold(b.book, b.member, now, slot.v, 0, GRACE)
    else
      ticket_add(b.book, b.cal, b.member, now, slot.v, b.len, slot.left, slot.ra, slot.rb, remember)
    end
    bit = bit * 2
  end
  return fresh
end

-- ahead_of counts the bookings before the task's moment m on the rule that
-- set it (binding): the tickets before its slot, or the quota's entries.
local function ahead_of(b, m, slot, binding)
  if b.bt then return rcall('ZCOUNT', b.book, '-inf', '(' .. int(slot.v)) end
  local t = b.p[binding]
  if t and (t.kind == 'q' or t.kind == 'c') then
    return rcall('ZCOUNT', key(b, binding), '(' .. int(b.now), '(' .. int(m))
  end
  return 0
end

-- book_new books the task anew (outcome: BOOKED, or REBOOKED after a
-- claim that could not go): the earliest moment every rule allows, counting
-- every booking before it; a place in its tenant's line instead of a slot
-- past the horizon; nothing past its deadline, or past what its calendar
-- and quiet plans reach.
local function book_new(b, outcome)
  local now = b.now
  local m, binding, window = quotas_moment(b)
  local f, gate, back, done = share(b, m)
  if done then return done end
  local slot, reach
  m, binding, window, slot, reach = find_slot(b, m, gate, binding, window)
  if slot == false then -- the calendar is too fragmented to place it: denied until where the search got
    return reply(DENIED, b.bi, 0, 0, now, reach - now, 0, 0)
  end
  if b.bt and binding == 0 then binding = b.bi end
  local H = b.p.horizon
  if f and H > 0 and binding == b.bi then
    -- Past the horizon (or the calendar behind the line): a place in the
    -- tenant's line, not a slot.
    local q, join = line_exit(f, back, gate, m, now, H, sleep_limit(b.p, back), b.len)
    if q then return in_place(b, f, q, join) end
  end
  if b.deadline > 0 and m > b.deadline then
    return reply(EXPIRED, binding, window, 0, now, m - now, 0, 0)
  end
  local far = beyond(b.p, m)
  if far then
    if binding == 0 then binding = far end
    return reply(DENIED, binding, window, 0, now, m - now, 0, 0)
  end
  -- A task back from its place may sleep for its moment as long as a
  -- ticket's claim may, on a cluster's recipient node too (no bucket, no
  -- share there: its bucket's node let it go).
  local go = m <= now + sleep_limit(b.p, back or not b.bt and b.back)
  local fresh = commit_booking(b, m, slot, go)
  if f then fair_took(f, b.fair, b.fexp, now, slot.v, b.len) end
  if go then
    -- It may go within max wait after all: admitted.
    if m == now then binding, window = 0, 0 end
    return reply(ADMITTED, binding, window, fresh, now, m - now, 0, 0)
  end
  return reply(outcome, binding, window, 0, now, m - now, 0, ahead_of(b, m, slot, binding))
end

-- book_task books a task whose keys start at keys[ki] (a: its arguments).
-- It returns false when the task's bucket ledger holds its slot (a task
-- that claimed and is admitted again: admit_task's plain path answers
-- that), else its reply (see reply). On a cluster a bucket's call may come
-- again with a floor past the slot it gave (the quotas' node set a later
-- moment): that slot, taken by this very request a round trip before, is
-- given back and the task books from the floor.
local function book_task(keys, ki, p, now, a)
  local b = booking_of(keys, ki, p, now, a)
  if b.bt then
    local v = bucket_held(b.cal, b.id, now, b.len)
    if v and v >= a.floor then return false end
    if v then bucket_undo(b.bt, b.state, b.cal, b.id, now, true) end
  end
  local ticket, latest = holdings(b)
  local outcome = BOOKED
  if ticket or latest > 0 then
    local done = claim(b, ticket, latest)
    if done then return done end
    outcome = REBOOKED
  end
  return book_new(b, outcome)
end
