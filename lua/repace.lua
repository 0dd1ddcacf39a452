-- repace.lua (after rules.lua and book.lua): two entry points, repace, that
-- moves a token bucket's waiting work to a changed rate, and reweigh (at the
-- end), that moves its tenants' lines to changed weights; and the movers
-- that pause.lua uses too.
--
--   args  -> a plan (see rules.lua) of one bucket take, at the new rate
--   keys  -> the bucket's keys
--
-- repace scales the waiting work (booked slots, tenants' gates and lines,
-- the join cursor) around now by k = old rate / new rate: a moment t after
-- now becomes now + (t - now) k. Why that keeps the order and the bound:
-- docs/booking.md, "A change of rate".
--
-- Claimed slots still ahead (a task sleeping in its worker until its slot)
-- are taken from their tasks and freed (see move_waiting).
--
-- The state hash's fields r and b keep the rate and burst the bucket's
-- calendar is laid at.
-- A bucket without one (first seen) records the rate and changes nothing;
-- a call at the rate recorded changes nothing: every worker of a fleet may
-- call it after a reload, and only the first one scales.
--
-- Returns {now, k (x 1e6; 0: nothing scaled)}. The caller scales the
-- moments it keeps the same way: the wake-ups of the tasks waiting
-- (jobs.Repace). One pass over the bucket's tickets (a horizon's worth) and
-- tenants: a rare call, whatever waits in line.

-- A mover maps a moment t after now to the moment it moves to (µs, whole),
-- keeping order: scaling (a rate change) or shifting (a pause). One rounding
-- for every moment, so spans that touched still touch and spans that did not
-- still do not.
local function scaling(now, k)
  return function(t) return now + ceil((t - now) * k) end
end

-- shifting moves the moments from pivot on by d; those before it stay (a
-- slot that starts at pivot waits; one that ends there went).
local function shifting(pivot, d)
  return function(t)
    if t < pivot then return t end
    return t + d
  end
end

-- move_at is moment t moved by mv: moments up to now stay.
local function move_at(t, now, mv)
  if t <= now then return t end
  return mv(t)
end

-- move_calendar moves the spans that end after now.
local function move_calendar(cal, now, mv)
  local z = rcall('ZRANGEBYSCORE', cal, '(' .. int(now), '+inf', 'WITHSCORES')
  if #z == 0 then return end
  for j = 1, #z, 2 do rcall('ZREM', cal, z[j]) end
  local last = now
  for j = 1, #z, 2 do
    local e = move_at(tonum(z[j + 1]), now, mv)
    rcall('ZADD', cal, int(e), int(move_at(tonum(z[j]), now, mv)))
    if e > last then last = e end
  end
  extend(cal, ceil_ms(last - now + CAL_LIFE))
end

-- ZADD_BATCH is how many members move_set writes per ZADD: a set of
-- 100,000 is 200 commands, not 100,000.
local ZADD_BATCH = 500

-- move_set moves the scores after now of a set of moments (tickets, the
-- tenants' expiries).
local function move_set(set, now, mv)
  local z = rcall('ZRANGEBYSCORE', set, '(' .. int(now), '+inf', 'WITHSCORES')
  local last, zargs, n = now, {}, 0
  for j = 1, #z, 2 do
    local v = move_at(tonum(z[j + 1]), now, mv)
    zargs[2 * n + 1], zargs[2 * n + 2] = fmt('%d', v), z[j]
    n = n + 1
    if n == ZADD_BATCH or j + 1 == #z then
      rcall('ZADD', set, unpack_(zargs, 1, 2 * n))
      n = 0
    end
    if v > last then last = v end
  end
  if #z > 0 then extend(set, ceil_ms(last - now + GRACE)) end
end

-- keep_tenants makes a bucket's tenants hash and expiry set live until
-- last, the latest expiry a mover wrote, as fair_write does for one.
local function keep_tenants(fair, exp, now, last)
  if last <= now then return end
  extend(fair, ceil_ms(last - now))
  extend(exp, ceil_ms(last - now))
end

-- move_tenants moves each waiting tenant's record (its last place, gate
-- and expiry: see fair_read), and the join cursor and end of places.
local function move_tenants(fair, exp, now, mv)
  local h = rcall('HGETALL', fair)
  local set, last = {fair}, now
  for j = 1, #h, 2 do
    local f, v = h[j], h[j + 1]
    if f == FAIR_J or f == FAIR_P then
      set[#set + 1], set[#set + 2] = f, int(move_at(tonum(v), now, mv))
    elseif f ~= FAIR_W then
      local a, b, c, e = match(v, '^(%d+),(%d+),(%d+),(%d+)$')
      if a then
        e = move_at(tonum(e), now, mv)
        if e > last then last = e end
        set[#set + 1], set[#set + 2] = f, fmt('%d,%d,%s,%d', move_at(tonum(a), now, mv),
          move_at(tonum(b), now, mv), c, e)
      end
    end
  end
  if #set > 1 then rcall('HSET', unpack_(set)) end
  move_set(exp, now, mv)
  keep_tenants(fair, exp, now, last)
end

-- move_waiting moves a bucket's waiting work (keys: the bucket's keys) by
-- mv: its calendar, tickets and tenants. Slots claimed ahead from the
-- moment from on are taken from their tasks (they find out by HasSlot), and
-- those from free_from on (len µs each, a slot of cost 1: the ledger keeps
-- starts only) are freed; free_from lies past the slack of every slot
-- claimed and BUMP_MARGIN more. Why: docs/booking.md, "A change of rate".
local function move_waiting(keys, now, from, free_from, mv, len)
  local book, cal = keys[2], keys[3]
  -- The ledger's entries (scored -V) of the slots after from.
  local claimed = rcall('ZRANGEBYSCORE', cal, '-inf', '(' .. int(-from), 'WITHSCORES')
  for j = 1, #claimed, 2 do
    local v = -tonum(claimed[j + 1])
    rcall('ZREM', cal, claimed[j])
    if v > free_from then bucket_free(cal, v, len, now) end
  end
  move_calendar(cal, now, mv)
  move_set(book, now, mv)
  move_tenants(keys[4], keys[5], now, mv)
end

local function repace(keys, args)
  if not rcall then bind() end
  local now = now_us()
  local p = plan(args[1])
  local t = p[1]
  if p.n ~= 1 or t.kind ~= 'b' then
    return redis.error_reply('throttle: repace needs one bucket take')
  end
  local key = keys[1]
  local rate = fmt('%.17g', t.rate)
  local was = rcall('HMGET', key, 'r', 'b')
  rcall('HSET', key, 'r', rate, 'b', fmt('%.17g', t.burst))
  local old = was[1]
  if not old and rcall('PTTL', key) == -1 then
    -- The bucket had no state (idle, or new): the hash is this call's and
    -- lives as long as the work that could wait on it.
    rcall('PEXPIRE', key, int(ceil_ms(GRACE)))
  end
  if not old or old == rate then return {now, 0} end
  -- The slots waiting were laid at the old rate and burst (a hash written
  -- before the burst was recorded: the burst as it is now).
  local was_t = {cost = 1, rate = tonum(old), burst = tonum(was[2]) or t.burst, reserve = 0}
  local k = tonum(old) / t.rate
  local free_from = now + BUMP_MARGIN + bucket_slack(was_t, true)
  move_waiting(keys, now, now, free_from, scaling(now, k), bucket_len(was_t))
  return {now, ceil(k * 1e6)}
end

-- reweigh moves a bucket's tenants' lines to changed weights: each waiting
-- tenant's last place and gate scale around now by k = (W' / w') / (W / w),
-- the join cursor and the end of places by the largest k, so no place
-- handed out lies beyond the end. The caller moves the wake-ups the same
-- way (jobs' Reweigh). Why: docs/booking.md, "A change of weight".
--
--   args  -> 'apply' (or 'check': only say whether a weight changed,
--            writing nothing), then n, then n pairs tenant, weight (every
--            tenant the config weighs; a tenant not named weighs 1)
--   keys  -> the bucket's keys
--
-- A tenant whose record holds its weight already is not scaled (k = 1,
-- unless others' changed): every worker of a fleet may call it after a
-- reload, and only the first one finds a weight to change.
--
-- Returns {now, changed (1: weights changed, 0: none), then k x 1e6 for
-- each of the n tenants named (1e6 for one not waiting)}.
local function reweigh(keys, args)
  if not rcall then bind() end
  local now = now_us()
  local fair = keys[4]
  local check, dflt, n = args[1] == 'check', 1, tonum(args[2])
  local want, names = {}, {}
  for j = 1, n do
    names[j] = args[1 + 2 * j]
    want[names[j]] = tonum(args[2 + 2 * j])
  end
  local h = rcall('HGETALL', fair)
  local W, live, cursors = 0, {}, {}
  for j = 1, #h, 2 do
    local f, v = h[j], h[j + 1]
    if f == FAIR_W then W = tonum(v)
    elseif f == FAIR_J or f == FAIR_P then cursors[f] = tonum(v)
    else
      local a, b, c, e = match(v, '^(%d+),(%d+),(%d+),(%d+)$')
      if a and tonum(e) > now then
        live[f] = {last = tonum(a), gate = tonum(b), w = tonum(c), exp = tonum(e), nw = want[f] or dflt}
      end
    end
  end
  local W2, changed = W, false
  for _, r in pairs(live) do
    W2 = W2 - r.w + r.nw
    if r.nw ~= r.w then changed = true end
  end
  local out = {now, 0}
  if not changed then return out end
  out[2] = 1
  if check then return out end
  local k, kmax, set, latest = {}, 1, {fair, FAIR_W, int(W2)}, now
  for t, r in pairs(live) do
    k[t] = (W2 / r.nw) / (W / r.w)
    if k[t] > kmax then kmax = k[t] end
    local mv = scaling(now, k[t])
    local e = move_at(r.exp, now, mv)
    if e > latest then latest = e end
    set[#set + 1], set[#set + 2] = t, fmt('%d,%d,%d,%d', move_at(r.last, now, mv),
      move_at(r.gate, now, mv), r.nw, e)
    rcall('ZADD', keys[5], 'XX', int(e), t) -- the expiry set agrees with the record
  end
  for f, v in pairs(cursors) do
    set[#set + 1], set[#set + 2] = f, int(move_at(v, now, scaling(now, kmax)))
  end
  rcall('HSET', unpack_(set))
  keep_tenants(fair, keys[5], now, latest)
  for j = 1, n do out[2 + j] = ceil((k[names[j]] or 1) * 1e6) end
  return out
end
