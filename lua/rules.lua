-- rules.lua: the rule kinds, shared by admit.lua, release.lua and pause.lua.
--
-- The four files make one library (see lua.go): loaded once with FUNCTION
-- LOAD where the server has Redis Functions (>= 7), so this code is compiled
-- and its local functions built once, not on every call; otherwise run whole
-- by EVALSHA, with a last line that calls an entry point on KEYS and ARGV.
-- Either way the entry points (admit, release, pause) get keys and args as
-- parameters.
--
-- A task's takes travel as one argument, its plan:
--
--   remember;maxwait[:ahead][;d][;k|;K][;n];take;take;...  fields of a take separated by ','
--
-- where remember is how long buckets remember a task ID (µs), maxwait the µs
-- a provider bucket may reserve ahead (0: none), ahead (optional, cluster
-- only) the µs ahead of now at which the quota entries a call adds are
-- stamped at the earliest (the group's request will reserve a provider
-- token up to that far ahead in a later call: see restamp), and a take is its kind, its
-- cost, then the kind's limits:
--
--   q,cost,limit,per_us[,limit,per_us...]  sliding-window quota, per window
--   b,cost,rate,burst[,reserve]            token bucket (rate in tokens/s,
--                                          may be fractional; reserve: tokens
--                                          kept for priority tasks)
--   f,cost,limit,per_us                    fixed-window counter
--   c,cost,limit,bound,bound[,bound...]    calendar quota: limit per window,
--                                          windows from each bound (µs) to
--                                          the next
--   h,cost,from,until[,start,end...]       quiet hours: no moment in
--                                          [start, end); covers [from, until)
--
-- A quota or calendar take whose kind starts with '*' ('*q', '*c') counts
-- only: it is recorded like any other (its entries count toward the rule),
-- but it never denies the task nor sets its wait or moment (count-only
-- traffic, see admit.lua).
--
-- Keys follow in take order: 'q' -> sorted set; 'b' -> state hash, ledger
-- sorted set, bookings sorted set; 'f' -> hash; 'c' -> sorted set; 'h' ->
-- none (t.nk is a take's number of keys). An admission's plan may
-- start its takes with 'd' (done): its first key is then the task's done
-- marker, whose existence means the task needs no admission any more (see
-- admit.lua). Then 'k' (or 'K' for a priority task) asks a task that may not
-- go within maxwait to book its moment (see book.lua). 'n' makes an
-- admission a check only: decided, nothing written (see admit.lua).
--
-- Limits travel with every call, never stored in Redis, so a changed limit
-- applies at once to the history already there.
--
-- Where it runs as a function, a parsed plan is kept in a table of this
-- library's, keyed by the plan's text: a plan is the same text call after
-- call, so the numbers in it are read once, not on every call (Lua reads a
-- number with strtod, which costs about as much as a Redis command's
-- dispatch). Likewise what a check finds for the commit is kept in scratch
-- tables reused by every call rather than in tables built per take. Neither
-- outlives what it describes: a plan's meaning is its text, and the scratch
-- is written by a task's check before its commit reads it, in one call. No
-- data is kept across calls: Redis alone holds the state.
--
-- A check only reads. Stale entries (a quota's older than its longest
-- window, a ledger's older than remember) count for nothing, not even as the
-- task's own, and are pruned by a later commit (a quota's by the next one
-- that writes the key, a ledger's by the next that extends it); so a denied
-- task writes nothing at all.
--
-- All times are µs from Redis TIME: doubles hold them exactly (< 2^53).
-- Numbers go to Redis either as Lua numbers, which Redis writes with %.17g
-- (exact), or, when whole, through int() ('%d', also exact and cheaper);
-- never through tostring or '..', which keep only 14 significant digits.

-- The globals the library uses, bound at the first call: the code of a
-- function library runs at FUNCTION LOAD with no globals but redis.
local rcall, tonum, floor, ceil, max, min, huge, fmt, gmatch, unpack_, find, sub

local function bind()
  rcall, tonum = redis.call, tonumber
  floor, ceil, max, min, huge = math.floor, math.ceil, math.max, math.min, math.huge
  fmt, gmatch, unpack_ = string.format, string.gmatch, unpack
  find, sub = string.find, string.sub
end

local function int(x)
  return fmt('%d', x)
end

-- A quota whose largest limit is at most QREAD is checked by reading its
-- whole set (at most QREAD + 1 entries) with one ZRANGE; a larger one, or a
-- set that holds more entries than that, by counting with ZCOUNT, so that a
-- check never reads an unbounded number of entries.
local QREAD, QREAD_S = 64, '64'

-- Parsed plans by text, and how many; the table starts over when it holds
-- too many (plans differ by limits, costs and max waits: a few per rule).
local plans, nplans = {}, 0
local MAXPLANS = 512

-- parse_plan reads a plan into {remember, maxwait, done, n (takes), [i] = take},
-- a take being {kind, cost, and its limits}; a quota's limits are
-- t[1..nw] and its windows (per_us) t[nw+1..2nw].
local function parse_plan(s)
  local p, n = {remember = 0, maxwait = 0, ahead = 0, done = false, n = 0}, -2
  for part in gmatch(s, '[^;]+') do
    n = n + 1
    if part == 'd' and n == 1 and not p.done then -- only first: its key is the task's first
      p.done, n = true, n - 1
    elseif (part == 'k' or part == 'K') and n == 1 and not p.book then
      -- booking (see book.lua); 'K' with priority
      p.book, p.prio, n = true, part == 'K', n - 1
    elseif part == 'n' and n == 1 and not p.dry then -- a check only (see admit.lua)
      p.dry, n = true, n - 1
    elseif n == -1 then
      p.remember = tonum(part)
    elseif n == 0 then
      local c = find(part, ':', 1, true)
      if c then
        p.maxwait, p.ahead = tonum(sub(part, 1, c - 1)), tonum(sub(part, c + 1))
      else
        p.maxwait = tonum(part)
      end
    else
      local f, nf = {}, 0
      for x in gmatch(part, '[^,]+') do
        nf = nf + 1
        f[nf] = tonum(x) or x
      end
      local kind, t, count = f[1], nil, false
      if kind == '*q' or kind == '*c' then kind, count = sub(kind, 2), true end
      if kind == 'q' and nf >= 4 and nf % 2 == 0 then
        local nw = (nf - 2) / 2
        t = {kind = 'q', cost = f[2], nw = nw, longest = 0, most = 0, least = huge}
        for w = 1, nw do
          local l, per = f[2 * w + 1], f[2 * w + 2]
          t[w], t[nw + w] = l, per
          if per > t.longest then t.longest = per end
          if l > t.most then t.most = l end
          if l < t.least then t.least = l end
        end
      elseif kind == 'b' and (nf == 4 or nf == 5) then
        t = {kind = 'b', cost = f[2], rate = f[3], burst = f[4], reserve = f[5] or 0}
      elseif kind == 'f' and nf == 4 then
        t = {kind = 'f', cost = f[2], limit = f[3], per = f[4]}
      elseif kind == 'c' and nf >= 5 then
        t = {kind = 'c', cost = f[2], limit = f[3], nb = nf - 3, nk = 1}
        for j = 4, nf do t[j - 3] = f[j] end
      elseif kind == 'h' and nf >= 4 and nf % 2 == 0 then
        t = {kind = 'h', cost = f[2], from = f[3], til = f[4], ns = (nf - 4) / 2, nk = 0}
        for j = 5, nf do t[j - 4] = f[j] end
      else
        error('throttle: bad take ' .. part)
      end
      t.count = count
      if not t.nk then
        t.nk = 1
        if kind == 'b' then t.nk = 3 end
      end
      p[n] = t
    end
  end
  p.n = n
  return p
end

-- plan returns the parsed plan of text s.
local function plan(s)
  local p = plans[s]
  if p then return p end
  p = parse_plan(s)
  if nplans >= MAXPLANS then plans, nplans = {}, 0 end
  plans[s], nplans = p, nplans + 1
  return p
end

-- TIME's seconds change once a second: the last ones are kept read.
local last_s, last_sv

local function now_us()
  local t = rcall('TIME')
  local s = t[1]
  if s ~= last_s then last_s, last_sv = s, tonum(s) end
  return last_sv * 1000000 + tonum(t[2])
end

-- Scratch, per take of the task being admitted: what its check found that
-- its commit needs; and a quota's live scores, newest first.
local HELD, A, B, C, SC = {}, {}, {}, {}, {}

local function ceil_ms(us)
  local ms = ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

-- scripted is set by the script form of the library (lua.go), which may run
-- on a server older than Redis 7, without PEXPIRE's GT.
local scripted = false

-- extend makes key live at least ms from now, never shorter than it already
-- does: a plain admission must not cut short a key that holds an entry
-- reserved further ahead. PEXPIRE GT leaves a key without a TTL as it is, so
-- when it sets nothing, PTTL tells that case (-1) from a longer TTL.
local function extend(key, ms)
  local s = int(ms)
  if scripted then
    if rcall('PTTL', key) < ms then rcall('PEXPIRE', key, s) end
  elseif rcall('PEXPIRE', key, s, 'GT') == 0 and rcall('PTTL', key) < ms then
    rcall('PEXPIRE', key, s)
  end
end

-- Sliding-window quota. An entry with score s counts in a window of length P
-- at time t while s > t - P. Entries older than the longest window are
-- stale: they count for nothing, not even as the task's own (a check treats
-- them as absent), and are pruned when the key is next written.
-- A denied take waits until enough of the entries in its window have left:
-- the need-th oldest one leaves at s + P.
--
-- quota_check returns ok, how long until the take would pass (the delay,
-- or for a take the task holds, the wait until its entry's moment), the
-- window that set the delay (0: none), remaining, whether the task holds the
-- take, and for the commit: the number of stale entries and of live ones
-- (both nil when it counted rather than read).
local function quota_check(t, key, id, now)
  local cost, nw = t.cost, t.nw
  local lo = now - t.longest
  local z, n
  if t.most <= QREAD then
    -- The whole set, oldest first: stale entries, then the live ones.
    z = rcall('ZRANGE', key, '0', QREAD_S, 'WITHSCORES')
    n = #z
    if n == 0 then return true, 0, 0, t.least - cost, false, 0, 0 end
    if n > 2 * QREAD then z = nil end
  end
  local ok, delay, window, remaining, mine = true, 0, 0, huge, nil
  if z then
    -- SC[1..m]: the live scores, newest first.
    local m = 0
    for j = n, 2, -2 do
      local s = tonum(z[j])
      if s <= lo then break end
      m = m + 1
      SC[m] = s
      if z[j - 1] == id then mine = s end
    end
    if mine then
      for w = 1, nw do
        local from, c = now - t[nw + w], 0
        while c < m and SC[c + 1] > from do c = c + 1 end
        if t[w] - c < remaining then remaining = t[w] - c end
      end
      return true, max(0, mine - now), 0, remaining, true, n / 2 - m, m
    end
    for w = 1, nw do
      local limit, per = t[w], t[nw + w]
      local from, c = now - per, 0
      while c < m and SC[c + 1] > from do c = c + 1 end
      local left, need = limit - c, c + cost - limit
      if need > 0 then
        -- The need-th oldest of the c in the window leaves first.
        local d = SC[c - need + 1] + per - now
        ok = false
        if d > delay then delay, window = d, w end
      else
        left = left - cost
      end
      if left < remaining then remaining = left end
    end
    return ok, delay, window, remaining, false, n / 2 - m, m
  end
  -- A large quota: counted, not read.
  local s = rcall('ZSCORE', key, id) -- false when absent
  if s then
    s = tonum(s)
    if s > lo then mine = s end
  end
  for w = 1, nw do
    local limit, per = t[w], t[nw + w]
    local from = '(' .. fmt('%.17g', now - per)
    local c = rcall('ZCOUNT', key, from, '+inf')
    local left = limit - c
    if not mine then
      local need = c + cost - limit
      if need > 0 then
        local e = rcall('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
        local d = tonum(e[2]) + per - now
        ok = false
        if d > delay then delay, window = d, w end
      else
        left = left - cost
      end
    end
    if left < remaining then remaining = left end
  end
  if mine then return true, max(0, mine - now), 0, remaining, true, nil, nil end
  return ok, delay, window, remaining, false, nil, nil
end

-- members lists the sorted-set members a quota take of this cost occupies:
-- the ID itself, then ID\31k for k = 2..cost (IDs carry no control characters).
local function members(id, cost)
  local m = {id}
  for k = 2, cost do m[k] = id .. '\31' .. k end
  return m
end

-- quota_commit prunes the stale entries (the check counted how many; a large
-- quota's check did not), adds the task's, and makes the key live until the
-- newest has left the longest window.
local function quota_commit(t, key, id, now, at, stale, live)
  if stale == nil then
    rcall('ZREMRANGEBYSCORE', key, '-inf', now - t.longest)
  elseif stale > 0 then
    rcall('ZREMRANGEBYRANK', key, '0', int(stale - 1))
  end
  local sat = int(at)
  if t.cost == 1 then
    rcall('ZADD', key, sat, id)
  else
    local m, args = members(id, t.cost), {}
    for i = 1, #m do
      args[2 * i - 1], args[2 * i] = sat, m[i]
    end
    rcall('ZADD', key, unpack_(args))
  end
  local ms = ceil_ms(at - now + t.longest)
  if live == 0 then
    rcall('PEXPIRE', key, int(ms)) -- a new set (or one the prune emptied): no TTL yet
  else
    extend(key, ms)
  end
end

-- quota_undo removes the task's entries, if it holds them (a stale entry is
-- not a holding: it is left to pruning), and sets the key's life back to
-- what the remaining entries need under this rule, as a commit would have
-- (an emptied set is gone on its own): an undone admission leaves the key to
-- expire when it would have without it.
local function quota_undo(t, key, id, now)
  local s = rcall('ZSCORE', key, id)
  if not s or tonum(s) <= now - t.longest then return false end
  rcall('ZREM', key, unpack_(members(id, t.cost)))
  local last = rcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if last[2] then
    rcall('PEXPIRE', key, int(ceil_ms(tonum(last[2]) - now + t.longest)))
  end
  return true
end

-- Token bucket. The state hash holds tokens (t, may be negative while
-- reservations are outstanding), the µs time they were counted (u) and the
-- µs time until which the ledger is known to live (e); an absent hash is a
-- full bucket, so the hash expires once it would be full.
-- The ledger remembers which task IDs hold tokens and the moment each may use
-- them, for idempotent retakes and for exact refunds. An entry older than
-- remember is forgotten: treated as absent, and pruned when the ledger is
-- next extended.
--
-- A take must keep the ledger alive until its moment plus remember. Rather
-- than prune and extend the ledger at every take (two or three commands),
-- bucket_commit extends it a sixteenth of remember further than the take
-- needs and records that in e; takes whose need e covers skip both. e is a
-- lower bound of the ledger's life: nothing shortens a ledger's TTL, and
-- whatever may delete the ledger early (a release emptying it) deletes e.
-- So a ledger holds at most 17/16 of remember's worth of entries, and lives
-- at most remember/16 longer than its last take needs.
--
-- Within one call that admits several tasks, the tasks sharing a bucket
-- (a batch for one provider) read its state once: what bucket_state read or
-- bucket_store wrote is kept here by key (MEMO_T[key]: tokens, false for an
-- absent hash; MEMO_U[key]: their time; MEMO_E[key]: e, false if none), and
-- only here, since nothing else writes a bucket's hash. The entry points set
-- memo for the call.
-- A ledger's tombstone: a member no task ID can be (IDs are never empty and
-- carry no control characters), scored with the latest moment at which
-- tokens went that no holder shows any more: a release that refunded
-- nothing, a forget (the provider took the tokens), a pause (scored with its
-- end). It is pruned with the ledger's forgotten entries.
local TOMB = '\0'

local memo, MEMO_T, MEMO_U, MEMO_E, MEMO_V, MEMO_R = false, nil, nil, nil, nil, nil

-- The most ledger entries bucket_tokens reads (see r).
local LEDGER_READ, LEDGER_READ_S = 256, '256'

-- The state hash also holds v, the bucket's booking tail (see book.lua):
-- the moment after the last slot handed to a booked task. It matters only
-- while it is ahead of now; a hash holding a v ahead is kept even when full.
--
-- And r, the latest moment a take was granted for ahead of now. A take for
-- a later moment counts its tokens at once, but the bucket must not refill
-- to its burst before that moment and hand them out again: while takes are
-- granted ahead, the bucket holds at most burst less their number. So when
-- r is later than the stored count's time u, the refill since u is
-- counted in steps: up to each such take's moment (the ledger's holders
-- after u, in order; the tombstone is not one) the bucket fills to burst
-- less the takes still ahead, and each moment that passes lets it fill one
-- further. r says when there may be such takes, so that the ledger is read
-- only then; past LEDGER_READ of them the bucket counts as empty.

-- bucket_state returns the stored tokens and their time, or nil, then e,
-- v and r (each nil if not recorded).
local function bucket_state(key)
  if memo then
    local x = MEMO_T[key]
    if x ~= nil then
      local e, v, r = MEMO_E[key] or nil, MEMO_V[key] or nil, MEMO_R[key] or nil
      if x then return x, MEMO_U[key], e, v, r end
      return nil, nil, e, v, r
    end
  end
  local st = rcall('HMGET', key, 't', 'u', 'e', 'v', 'r')
  local x, last, e, v, r = tonum(st[1]), tonum(st[2]), tonum(st[3]), tonum(st[4]), tonum(st[5])
  if not x or not last then x, last = nil, nil end
  if memo then
    MEMO_T[key], MEMO_U[key], MEMO_E[key], MEMO_V[key], MEMO_R[key] = x or false, last, e or false, v or false, r or false
  end
  return x, last, e, v, r
end

-- bucket_tokens returns the tokens the bucket has now, then e and v.
local function bucket_tokens(t, key, ledger, now)
  local tokens, last, e, v, r = bucket_state(key)
  if not tokens then return t.burst, e, v end
  -- A clock that went back (a failover to a node whose clock is behind) adds nothing.
  if r and r > last then
    local z = rcall('ZRANGEBYSCORE', ledger, '(' .. int(last), '+inf', 'WITHSCORES', 'LIMIT', '0', LEDGER_READ_S)
    if #z >= 2 * LEDGER_READ then return min(tokens, 0), e, v end
    local ahead, at = 0, last
    for j = 1, #z, 2 do
      if z[j] ~= TOMB then ahead = ahead + 1 end
    end
    for j = 1, #z, 2 do
      if z[j] ~= TOMB then
        local m = tonum(z[j + 1])
        if m > now then break end
        if m > at then
          tokens = min(t.burst - ahead, tokens + (m - at) * t.rate / 1e6)
          at = m
        end
        ahead = ahead - 1
      end
    end
    if now > at then tokens = tokens + (now - at) * t.rate / 1e6 end
    if tokens > t.burst - ahead then return t.burst - ahead, e, v end
    return tokens, e, v
  end
  if now > last then tokens = tokens + (now - last) * t.rate / 1e6 end
  if tokens > t.burst then return t.burst, e, v end
  return tokens, e, v
end

-- bucket_store saves the tokens at now, e if given (else the stored e stays
-- as it is) and the booking tail v (nil: none ahead). A full bucket with no
-- tail ahead is deleted, e with it.
local function bucket_store(t, key, now, tokens, e, v)
  if v and v <= now then v = nil end
  if tokens >= t.burst and not v then
    rcall('DEL', key)
    if memo then MEMO_T[key], MEMO_E[key], MEMO_V[key] = false, false, false end
    return
  end
  if tokens > t.burst then tokens = t.burst end
  if e then
    rcall('HSET', key, 't', tokens, 'u', int(now), 'e', int(e))
  else
    rcall('HSET', key, 't', tokens, 'u', int(now))
  end
  local ms = ceil_ms((t.burst - tokens) * 1e6 / t.rate)
  if v then
    rcall('HSET', key, 'v', int(v))
    ms = max(ms, ceil_ms(v - now))
  else
    rcall('HDEL', key, 'v')
  end
  rcall('PEXPIRE', key, int(ms))
  if memo then
    MEMO_T[key], MEMO_U[key], MEMO_V[key] = tokens, now, v or false
    if e then MEMO_E[key] = e end
  end
end

-- bucket_held returns the moment the ledger holds for the task, or nil.
local function bucket_held(ledger, id, now, remember)
  local s = rcall('ZSCORE', ledger, id)
  if s then
    s = tonum(s)
    if s > now - remember then return s end
  end
  return nil
end

-- BIG is the wait (µs, an hour) of a take the bucket cannot tell when it
-- can grant (more takes ahead than LEDGER_READ): it is not granted.
local BIG = 3600000000

-- bucket_wait returns the µs until the bucket holds need tokens. While
-- takes are granted ahead of now (see r) it fills only to burst less their
-- number, one more as each of their moments passes: the wait counts that,
-- so that a take is never granted tokens the bucket would have had only
-- by filling past its burst.
local function bucket_wait(t, key, ledger, now, tokens, need)
  if tokens >= need then return 0 end
  local _, _, _, _, r = bucket_state(key)
  if not (r and r > now) then return ceil((need - tokens) * 1e6 / t.rate) end
  local z = rcall('ZRANGEBYSCORE', ledger, '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT', '0', LEDGER_READ_S)
  if #z >= 2 * LEDGER_READ then return BIG end
  local ahead = 0
  for j = 1, #z, 2 do
    if z[j] ~= TOMB then ahead = ahead + 1 end
  end
  local at, c = now, tokens
  for j = 1, #z, 2 do
    if z[j] ~= TOMB then
      local m = tonum(z[j + 1])
      if need <= t.burst - ahead then
        local x = at + (need - c) * 1e6 / t.rate
        if x <= m then return ceil(x - now) end
      end
      c = min(t.burst - ahead, c + (m - at) * t.rate / 1e6)
      at = m
      ahead = ahead - 1
    end
  end
  if need > t.burst then return BIG end
  return ceil(at + (need - c) * 1e6 / t.rate - now)
end

-- bucket_need is what a take must leave in the bucket: its cost, plus the
-- bucket's reserve unless the task has priority (the reserve is kept for
-- priority traffic: see book.lua).
local function bucket_need(t, prio)
  if prio then return t.cost end
  return t.cost + t.reserve
end

-- bucket_check returns the wait until there would be enough tokens (false
-- if there are, or the task holds the take), how long until the take would
-- pass (that wait, or for a take the task holds, the wait until its moment),
-- remaining, whether the task holds the take, the tokens, e and v (see
-- bucket_state) for bucket_commit.
--
-- When an earlier take of the task already denies (denied) and the tokens
-- are there, the take passes whether or not the task holds it, and nothing
-- will be written: the ledger is not read, and the take counts as not held
-- (remaining after its cost). That saves a command on the most common path
-- of a busy fleet, a recipient's quota denying.
local function bucket_check(t, key, ledger, id, now, remember, denied, prio)
  local tokens, e, v = bucket_tokens(t, key, ledger, now)
  local need = bucket_need(t, prio)
  if denied and tokens >= need then
    return false, 0, floor(tokens - t.cost), false, tokens, e, v
  end
  local mine = bucket_held(ledger, id, now, remember)
  if mine then
    return false, max(0, mine - now), max(0, floor(tokens)), true, tokens, e, v
  elseif tokens >= need then
    return false, 0, floor(tokens - t.cost), false, tokens, e, v
  end
  -- Not enough tokens: the wait until there are. admit decides whether the
  -- caller may reserve them (wait <= max wait) or is denied.
  local reserve = bucket_wait(t, key, ledger, now, tokens, need)
  return reserve, reserve, max(0, floor(tokens)), false, tokens, e, v
end

-- bucket_commit takes the tokens for moment at, and records the holder. The
-- ledger is pruned and extended only when e does not cover the take (see
-- the bucket's comment above). v is the booking tail to store.
local function bucket_commit(t, key, ledger, id, now, at, remember, tokens, e, v)
  rcall('ZADD', ledger, int(at), id)
  if e and at + remember <= e then
    bucket_store(t, key, now, tokens - t.cost, nil, v)
  else
    rcall('ZREMRANGEBYSCORE', ledger, '-inf', int(now - remember))
    e = at + remember + ceil(remember / 16)
    extend(ledger, ceil_ms(e - now))
    bucket_store(t, key, now, tokens - t.cost, e, v)
  end
  if at > now and tokens + (at - now) * t.rate / 1e6 > t.burst then
    -- Granted for a moment by which the bucket would have filled: it keeps
    -- its tokens short until then (see r). A take for the moment its
    -- tokens come needs nothing more: the count is exact.
    local _, _, _, _, r = bucket_state(key)
    if not r or at > r then
      rcall('HSET', key, 'r', int(at))
      if memo then MEMO_R[key] = at end
    end
    -- The hash lives until the bucket would be full after that take.
    extend(key, ceil_ms(at - now + t.burst * 1e6 / t.rate))
  end
end


-- tomb raises the ledger's tombstone to moment s (never lowers it) and keeps
-- the ledger alive while s can matter: as long as a holder older than s can.
local function tomb(ledger, s, now, remember)
  local old = rcall('ZSCORE', ledger, TOMB)
  if old and tonum(old) >= s then return end
  rcall('ZADD', ledger, int(s), TOMB)
  extend(ledger, ceil_ms(s - now + remember))
end

-- bucket_undo removes the task's ledger entry and refunds its cost only if
-- nothing took tokens at a moment later than the released one's: no other
-- holder and no tombstone is later. Two reasons:
--   - later holders were granted moments that assumed these tokens gone: a
--     refund while they are outstanding would let a new request take a
--     moment they still hold;
--   - a moment that has passed is refunded at now, and tokens given back
--     then are only the tokens the bucket would have had without the
--     release's take if it never filled to burst in between. With no take
--     after the released moment it only refilled since, so min(burst,
--     tokens + cost) is exact; a take after it may have followed a moment
--     at which the bucket without the released take would have been full,
--     and the refill it lost there would be handed out twice.
-- Otherwise nothing is refunded (the tokens come back with time: the bucket
-- may under-send by that much, never over-send) and the tombstone records
-- the take. With refund false (forget) the entry goes the same way: the
-- provider did the work.
local function bucket_undo(t, key, ledger, id, now, remember, refund)
  local s = bucket_held(ledger, id, now, remember)
  if not s then return false end
  rcall('ZREM', ledger, id)
  -- The ledger may now be empty, and so deleted: forget how long it lives,
  -- or one created again would get no TTL until e ran out.
  rcall('HDEL', key, 'e')
  if memo then MEMO_E[key] = false end
  if refund and rcall('ZCOUNT', ledger, '(' .. int(s), '+inf') == 0 then
    local tokens, _, v = bucket_tokens(t, key, ledger, now)
    bucket_store(t, key, now, min(t.burst, tokens + t.cost), nil, v)
  else
    tomb(ledger, s, now, remember)
  end
  return true
end

-- Fixed-window counter: windows are aligned to the epoch. The hash holds the
-- window start (w), the count (n) and, per task ID counted in the window,
-- its cost ('i:' .. id, so no ID can be mistaken for w or n). fixed_state
-- returns the window start, its count, and this task's cost or nil.
local function fixed_state(t, key, id, now)
  local start = now - now % t.per
  local st = rcall('HMGET', key, 'w', 'n', 'i:' .. id)
  if tonum(st[1]) ~= start then return start, 0, nil end
  return start, tonum(st[2]) or 0, tonum(st[3])
end

-- fixed_check returns ok, the delay, remaining, whether the task holds the
-- take, and the window's start and count.
local function fixed_check(t, key, id, now)
  local start, n, mine = fixed_state(t, key, id, now)
  local remaining = t.limit - n
  if mine then
    return true, 0, remaining, true, start, n
  elseif n + t.cost > t.limit then
    return false, start + t.per - now, remaining, false, start, n
  end
  return true, 0, remaining - t.cost, false, start, n
end

local function fixed_commit(t, key, id, now, start, count)
  if count == 0 then rcall('DEL', key) end
  rcall('HSET', key, 'w', int(start), 'n', int(count + t.cost), 'i:' .. id, int(t.cost))
  rcall('PEXPIRE', key, int(ceil_ms(start + t.per - now)))
end

-- fixed_undo gives back the cost the task was counted with.
local function fixed_undo(t, key, id, now)
  local start, n, mine = fixed_state(t, key, id, now)
  if not mine then return false end
  if n - mine <= 0 then
    rcall('DEL', key)
  else
    rcall('HSET', key, 'n', int(n - mine))
    rcall('HDEL', key, 'i:' .. id)
  end
  return true
end

-- Calendar quota: a limit per calendar window, the windows given by the
-- plan as bounds (µs) the engine computed in the recipient's zone (so that
-- days of 23 or 25 hours are right), Redis time choosing the window. An
-- entry (member: task ID, score: its moment) counts in the window that holds
-- its moment; entries of windows before now's count for nothing and are
-- pruned by the next commit. A time outside the bounds is an error: the
-- engine sends windows on both sides of its own clock's.

-- cal_index returns i with t[i] <= x < t[i + 1], or nil when the bounds do
-- not hold x.
local function cal_index(t, x)
  if x < t[1] or x >= t[t.nb] then return nil end
  local i = 1
  while t[i + 1] <= x do i = i + 1 end
  return i
end

local function cal_now(t, now)
  local i = cal_index(t, now)
  if not i then error('throttle: calendar bounds do not hold Redis time ' .. int(now) .. ': is the worker clock a day off?') end
  return i
end

local function cal_count(t, key, i)
  return rcall('ZCOUNT', key, int(t[i]), '(' .. int(t[i + 1]))
end

-- cal_check returns ok, the delay, remaining and whether the task holds
-- the take. A take may be stamped up to span after now (a reserved token's
-- wait, a cluster's ahead): it must fit every window from now's to the one
-- holding now + span, and when one is full it waits for the start of the
-- window after the last full one.
local function cal_check(t, key, id, now, span)
  local i = cal_now(t, now)
  local s = rcall('ZSCORE', key, id)
  s = s and tonum(s)
  local mine = s and s >= t[i]
  local j = cal_index(t, now + span) or t.nb - 1
  local ok, delay, remaining = true, 0, huge
  for w = i, j do
    local c = cal_count(t, key, w)
    local left = t.limit - c
    if not mine then
      if c + t.cost > t.limit then
        ok, delay = false, t[w + 1] - now
      else
        left = left - t.cost
      end
    end
    if left < remaining then remaining = left end
  end
  if mine then return true, max(0, s - now), remaining, true end
  return ok, delay, remaining, false
end

-- cal_held returns the moment of the task's entry if it counts (in now's
-- window or a later one), else nil.
local function cal_held(t, key, id, now)
  local s = rcall('ZSCORE', key, id)
  s = s and tonum(s)
  if s and s >= t[cal_now(t, now)] then return s end
  return nil
end

-- cal_commit prunes the windows before now's, adds the task's entries at
-- moment at, and keeps the key until at's window ends.
local function cal_commit(t, key, id, now, at)
  rcall('ZREMRANGEBYSCORE', key, '-inf', '(' .. int(t[cal_now(t, now)]))
  local sat = int(at)
  local m, args = members(id, t.cost), {}
  for i = 1, #m do
    args[2 * i - 1], args[2 * i] = sat, m[i]
  end
  rcall('ZADD', key, unpack_(args))
  local j = cal_index(t, at) or t.nb - 1
  extend(key, ceil_ms(t[j + 1] - now))
end

-- cal_undo removes the task's entries if they count.
local function cal_undo(t, key, id, now)
  if not cal_held(t, key, id, now) then return false end
  rcall('ZREM', key, unpack_(members(id, t.cost)))
  return true
end

-- Quiet hours: spans (µs, from the plan, in order, not touching) in which no
-- moment may be taken; a take inside one waits until it ends. The engine
-- computes them in the recipient's zone. Nothing is stored.

-- quiet_end returns the end of the span holding x, or nil.
local function quiet_end(t, x)
  for j = 1, 2 * t.ns, 2 do
    if x < t[j] then return nil end
    if x < t[j + 1] then return t[j + 1] end
  end
  return nil
end

-- quiet_check returns ok and the delay: a take that may be stamped up to
-- span after now is refused when a span meets [now, now + span], until that
-- span ends.
local function quiet_check(t, now, span)
  if now < t.from or now >= t.til then
    error('throttle: quiet hours do not cover Redis time ' .. int(now) .. ': is the worker clock a day off?')
  end
  for j = 1, 2 * t.ns, 2 do
    if t[j] > now + span then break end
    if t[j + 1] > now then return false, t[j + 1] - now end
  end
  return true, 0
end
