-- rules.lua: the rule kinds, shared by book.lua, admit.lua, release.lua
-- and pause.lua.
--
-- The six files make one library, run by FCALL or EVALSHA (lua.go;
-- docs/design.md, "How the Lua runs"); either way the entry points get keys
-- and args as parameters. They are seven:
--
--   admit        admit.lua: admits tasks
--   book         admit.lua: books tasks (the steps in book.lua)
--   release      release.lua: gives back what admissions took
--   forget       release.lua: drops bucket holdings, their slots kept taken
--   pause        pause.lua: pauses a bucket (a provider's Retry-After)
--   repace       repace.lua: moves a bucket's waiting work to a changed rate
--   reweigh      repace.lua: moves a bucket's tenants' lines to changed weights
--
-- A task's takes travel as one argument, its plan:
--
--   remember;maxwait[;d][;k|;K][;u][;n];take;take;...  fields of a take separated by ','
--
-- where remember is how long buckets remember a task ID (µs), maxwait the µs
-- a provider bucket may reserve ahead (0: none), and a take is its kind, its
-- cost, then the kind's limits:
--
--   q,cost,limit,per_us[,limit,per_us...]  sliding-window quota, per window
--   b,cost,rate,burst[,reserve]            token bucket (rate in tokens/s,
--                                          may be fractional; reserve: tokens
--                                          kept for priority tasks)
--   c,cost,limit,bound,bound[,bound...]    calendar quota: limit per window,
--                                          windows from each bound (µs) to
--                                          the next
--   h,cost,from,until[,start,end...]       quiet hours: no moment in
--                                          [start, end); covers [from, until)
--
-- A quota or calendar take whose kind starts with '*' ('*q', '*c') counts
-- only: it is recorded like any other (its entries count toward the rule),
-- but it never denies the task nor sets its wait or moment (count-only
-- traffic, see admit.lua). One whose kind starts with '?' ('?q', '?c',
-- '?h') is a rule in shadow mode: it counts only too (quiet hours hold
-- nothing either way), and the reply says when it would have held the task
-- back, decided in the same step as its entries are written.
--
-- Keys follow in take order: 'q' -> sorted set; 'b' -> state hash, tickets
-- sorted set, slot calendar sorted set (with the ledger), tenants hash,
-- tenants' expiry sorted set; 'c' -> sorted set; 'h' -> none
-- (t.nk is a take's number of keys). A plan may start its takes with 'd'
-- (done): its first key is then the task's done marker, whose existence
-- means the task needs no admission any more (see admit.lua). 'D' looks
-- for it only where the first take, a quota, finds the task holding its
-- entry: a task marked done took it, and it lasts as long as the marker
-- (the caller says so: throttle.Request.DoneIfHeld), so a task that holds
-- none is not marked, and the most common admission saves the look. Then, in a
-- plan for book, 'k' (or 'K' for a priority task) says it books; 'k:H'
-- books at most H µs ahead on its bucket, and gives a task beyond that
-- horizon a place in line; 'u' after it says work the caller has not seen
-- waits behind the task (a fresh task that cannot go now takes a place in
-- line: see book.lua). 'n' makes an admission a check only: decided,
-- nothing written (see admit.lua). 'N:W' says the task holds no entry of a
-- quota whose longest window is W µs (a cluster's other group found it
-- so): see admit.lua's unheld. 'g' says the task's done marker is read
-- beside this call, on another node (a cluster's first call): a bucket
-- take whose ledger has the task at a slot that ended answers done
-- without writing, and the caller decides by the marker.
--
-- Limits travel with every call, never stored in Redis, so a changed limit
-- applies at once to the history already there.
--
-- Where it runs as a function, a parsed plan is kept in a table of this
-- library's, keyed by the plan's text: a plan is the same text call after
-- call, so the numbers in it are read once, not on every call (Lua reads a
-- number with strtod, which costs about as much as a Redis command's
-- dispatch). That is why a task's rules travel as one text and not as
-- positional numbers, which would be read on every call: reading the plan on
-- every call costs 6 µs more Redis CPU per decision (24 µs against 18 µs,
-- BenchmarkAdmitVsBaselines). What differs from task to task (its ID,
-- deadline, weight...) travels positionally (see admit.lua). Likewise what a
-- check finds for the commit is kept in scratch tables reused by every call
-- rather than in tables built per take. Neither
-- outlives what it describes: a plan's meaning is its text, and the scratch
-- is written by a task's check before its commit reads it, in one call. The
-- text of the last number and marks written is kept too (see int,
-- bucket_add), and the reply's table is reused. No data is kept
-- across calls: Redis alone holds the state.
--
-- A check only reads: stale entries count for nothing, not even as the
-- task's own, and are pruned by a later commit, so a denied task writes
-- nothing (docs/design.md, "Algorithms": All or nothing, idempotent, no
-- trace).
--
-- All times are µs from Redis TIME: doubles hold them exactly (< 2^53).
-- Numbers go to Redis either as Lua numbers, which Redis writes with %.17g
-- (exact), or, when whole, through int() ('%d', also exact and cheaper);
-- never through tostring or '..', which keep only 14 significant digits.

-- The globals the library uses, bound at the first call: the code of a
-- function library runs at FUNCTION LOAD with no globals but redis.
local rcall, tonum, floor, ceil, max, min, huge, fmt, gmatch, unpack_, find, sub, match

local function bind()
  rcall, tonum = redis.call, tonumber
  floor, ceil, max, min, huge = math.floor, math.ceil, math.max, math.min, math.huge
  fmt, gmatch, unpack_ = string.format, string.gmatch, unpack
  find, sub, match = string.find, string.sub, string.match
end

-- int writes a whole number for Redis. A take writes the same one more than
-- once (now, as a slot's start and a quota entry's score), so the last one
-- written is kept: formatting costs about a third of a command.
local int_x, int_s

local function int(x)
  if x ~= int_x then int_x, int_s = x, fmt('%d', x) end
  return int_s
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
  local p, n = {remember = 0, maxwait = 0, horizon = 0, done = false, n = 0}, -2
  for part in gmatch(s, '[^;]+') do
    n = n + 1
    if (part == 'd' or part == 'D') and n == 1 and not p.done then -- only first: its key is the task's first
      p.done, p.lazy, n = true, part == 'D', n - 1
    elseif (sub(part, 1, 1) == 'k' or sub(part, 1, 1) == 'K') and n == 1 and not p.book then
      -- booking (see book.lua); 'K' with priority; ':H' a horizon of H µs
      p.book, p.prio, n = true, sub(part, 1, 1) == 'K', n - 1
      if sub(part, 2, 2) == ':' then p.horizon = tonum(sub(part, 3)) end
    elseif part == 'u' and n == 1 and p.book and not p.unseen then -- unseen work behind it
      p.unseen, n = true, n - 1
    elseif part == 'n' and n == 1 and not p.dry then -- a check only (see admit.lua)
      p.dry, n = true, n - 1
    elseif sub(part, 1, 2) == 'N:' and n == 1 and not p.unheld then -- the task holds no slot (see admit.lua)
      p.unheld, n = tonum(sub(part, 3)), n - 1
    elseif part == 'g' and n == 1 and not p.guard then -- its done marker is read elsewhere (see admit.lua)
      p.guard, n = true, n - 1
    elseif n == -1 then
      p.remember = tonum(part)
    elseif n == 0 then
      p.maxwait = tonum(part)
    else
      local f, nf = {}, 0
      for x in gmatch(part, '[^,]+') do
        nf = nf + 1
        f[nf] = tonum(x) or x
      end
      local kind, t, count, shadow = f[1], nil, false, false
      if kind == '*q' or kind == '*c' then kind, count = sub(kind, 2), true end
      if kind == '?q' or kind == '?c' or kind == '?h' then kind, count, shadow = sub(kind, 2), true, true end
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
        t = {kind = 'b', cost = f[2], rate = f[3], burst = f[4], reserve = f[5] or 0, cost_s = int(f[2])}
      elseif kind == 'c' and nf >= 5 then
        t = {kind = 'c', cost = f[2], limit = f[3], nb = nf - 3, nk = 1}
        for j = 4, nf do t[j - 3] = f[j] end
      elseif kind == 'h' and nf >= 4 and nf % 2 == 0 then
        t = {kind = 'h', cost = f[2], from = f[3], til = f[4], ns = (nf - 4) / 2, nk = 0}
        for j = 5, nf do t[j - 4] = f[j] end
      else
        error('throttle: bad take ' .. part)
      end
      t.count, t.shadow = count, shadow
      if not t.nk then
        t.nk = 1
        if kind == 'b' then t.nk = 5 end
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

-- task_keys is the keys of a call whose task brings n arguments. On a
-- Redis Cluster, the takes of two subjects whose slots one master serves
-- share a call (throttle/cluster.go): the first subject's keys are
-- declared, and route the call; the second's follow the arguments, read
-- under the library's allow-cross-slot-keys. Its first key is looked at
-- before anything else is read or written: a slot moved off this master
-- since the caller's map answers NONLOCAL, having done nothing, and the
-- caller asks each subject's master on its own.
local function task_keys(keys, args, n)
  if #args <= n then return keys end
  local probe = redis.pcall('EXISTS', args[n + 1])
  if type(probe) == 'table' and probe.err then
    return nil, 'NONLOCAL ' .. probe.err
  end
  local all = {}
  for i = 1, #keys do all[i] = keys[i] end
  for i = n + 1, #args do all[#all + 1] = args[i] end
  return all
end

-- TIME's seconds change once a second: the last ones are kept read.
local last_s, last_sv

local function now_us()
  local t = rcall('TIME')
  local s = t[1]
  if s ~= last_s then last_s, last_sv = s, tonum(s) end
  return last_sv * 1000000 + tonum(t[2])
end

-- ceil_ms is a TTL in whole ms for a key that must live us µs from now.
-- Redis counts a TTL from now's whole ms, which may be up to a ms before
-- now: one ms more, so that a key never expires before its last entry
-- leaves (seen: a quota entry lost a ms before its window ended, in 1 of
-- 4 differential runs).
local function ceil_ms(us)
  local ms = ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms + 1
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

-- quota_read is quota_check for a set read whole: z is its ZRANGE WITHSCORES
-- (n values, oldest first), lo the moment before which entries are stale.
local function quota_read(t, id, now, lo, z, n)
  local cost, nw = t.cost, t.nw
  local ok, delay, window, remaining, mine = true, 0, 0, huge, nil
  local sc, m = {}, 0 -- sc[1..m]: the live scores, newest first

  for j = n, 2, -2 do
    local s = tonum(z[j])
    if s <= lo then break end
    m = m + 1
    sc[m] = s
    if z[j - 1] == id then mine = s end
  end
  if mine then
    for w = 1, nw do
      local from, c = now - t[nw + w], 0
      while c < m and sc[c + 1] > from do c = c + 1 end
      if t[w] - c < remaining then remaining = t[w] - c end
    end
    return true, max(0, mine - now), 0, remaining, true, n / 2 - m, m
  end
  for w = 1, nw do
    local limit, per = t[w], t[nw + w]
    local from, c = now - per, 0
    while c < m and sc[c + 1] > from do c = c + 1 end
    local left, need = limit - c, c + cost - limit
    if need > 0 then
      -- The need-th oldest of the c in the window leaves first.
      local d = sc[c - need + 1] + per - now
      ok = false
      if d > delay then delay, window = d, w end
    else
      left = left - cost
    end
    if left < remaining then remaining = left end
  end
  return ok, delay, window, remaining, false, n / 2 - m, m
end

-- quota_count is quota_check for a large quota: counted, not read.
local function quota_count(t, key, id, now, lo)
  local cost, nw = t.cost, t.nw
  local ok, delay, window, remaining, mine = true, 0, 0, huge, nil
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

-- Sliding-window quota: an entry with score s counts in a window of length
-- P at time t while s > t - P (docs/design.md, "Algorithms").
--
-- quota_check returns ok, how long until the take would pass (the delay,
-- or for a take the task holds, the wait until its entry's moment), the
-- window that set the delay (0: none), remaining, whether the task holds the
-- take, and for the commit: the number of stale entries and of live ones
-- (both nil when it counted rather than read).
local function quota_check(t, key, id, now)
  local lo = now - t.longest
  if t.most <= QREAD then
    -- The whole set, oldest first: stale entries, then the live ones.
    local z = rcall('ZRANGE', key, '0', QREAD_S, 'WITHSCORES')
    local n = #z
    if n == 0 then return true, 0, 0, t.least - t.cost, false, 0, 0 end
    if n <= 2 * QREAD then return quota_read(t, id, now, lo, z, n) end
  end
  return quota_count(t, key, id, now, lo)
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

-- Token bucket, kept as a calendar of slots (virtual scheduling, as GCRA
-- does it): a take of cost c holds a slot of c/R (len, whole µs) starting
-- at its moment V, no two slots overlap, and it may go from V - slack to V
-- (bucket_slack). Why that keeps the bucket's bound: docs/design.md,
-- "Algorithms".
--
-- The calendar (a bucket's third key) is the busy time: spans of slots
-- merged where they touch, in a sorted set (member: the span's start,
-- score: its end, both µs), searched by bucket_find. Besides the spans it
-- holds marks of its life, '-' .. µs scored 0 (see bucket_add), which no
-- read from now on sees.
--
-- PAST: a span that a take starts at the moment it is made is written with
-- start 0, not its moment: it holds now, so the next one that starts at its
-- moment finds it ended and overwrites it, and a bucket that is never short
-- holds one span. A start of 0 only ever hides free time in the past.
--
-- The ledger lives in the calendar's set: an entry is member LEDGER .. task
-- ID, scored -V, below every span and mark, which no read of the spans
-- sees. A task holds its slot until it ends (V + len). Booked slots not yet
-- claimed are tickets (the second key, book.lua). The state hash (the first
-- key) holds the end of a pause (p, pause.lua), the rate its waiting work
-- was laid at (repace.lua), and the tokens workers sent per 10 s bin
-- (written by the workers: throttle/sends.go).
--
-- Pruning (bucket_add, bucket_commit) and what the keys hold as a result:
-- docs/design.md, "Algorithms". An entry's slot is taken to end one slot of
-- the pruning take's cost after it starts (the ledger keeps starts only): a
-- take of a larger cost on the same bucket may lose its entry before its
-- slot ends plus remember, never before it ends less that difference.

-- bucket_len is the µs a take's slot lasts.
local function bucket_len(t)
  return ceil(t.cost * 1e6 / t.rate)
end

-- bucket_slack is how long before its slot a take may go: the burst less
-- its cost, and less the reserve unless the task has priority (the reserve
-- is kept for priority traffic: see book.lua).
local function bucket_slack(t, prio)
  local b = t.burst - t.cost
  if not prio then b = b - t.reserve end
  if b <= 0 then return 0 end
  return floor(b * 1e6 / t.rate)
end

-- The most spans bucket_find steps over before it gives up.
local FIND_STEPS = 64

-- bucket_find returns the earliest start >= s of a free span of len µs, the
-- start of the span that ends there (nil: none), and the start and end of
-- the first span after it (nil, nil: none). That span's start is returned
-- only when it begins where the free span ends (bucket_add merges the two);
-- its end alone says the calendar already lives past the free span (see
-- bucket_add). nil and how far it got if it stepped over FIND_STEPS spans
-- (each with a gap before it too short for the slot: spans that touch
-- merge): no slot is free before that, and a take that finds none waits
-- until then, not for good. It reads two spans
-- at a time: a take that is not the first of its moment steps over the
-- span the ones before it took, and finds nothing after it. The
-- first read takes a span that ends at s as well: a slot sought from the
-- end of another (a place in line a slot after the one before, the end
-- of the busy span before a gate) merges with it. Read from after s, it
-- was written as a span of its own beside it: BenchmarkPacing's calendar
-- held up to 233 spans (29 with the merge, 3.2 reads a message against
-- 6.1), and a search from before 64 of them gave up.
local function bucket_find(cal, s, len)
  local c, left = s, nil
  local z, j, n = nil, 1, 0
  for _ = 1, FIND_STEPS do
    if j > n then
      if n == 2 then return c, left end -- the last read found one span: none after it
      z = rcall('ZRANGEBYSCORE', cal, z and fmt('(%d', c) or int(c), '+inf', 'WITHSCORES', 'LIMIT', '0', '2')
      n, j = #z, 1
      if n == 0 then return c, left end
    end
    local a, b = tonum(z[j]), tonum(z[j + 1])
    j = j + 2
    if a >= c + len then
      if a == c + len then return c, left, a, b end
      return c, left, nil, b
    end
    c, left = b, a
  end
  return nil, c
end

-- CAL_LIFE is the step (µs) a calendar's life is extended by, PRUNE_BIN the
-- one it is pruned at: see bucket_add.
local CAL_LIFE, PRUNE_BIN = 100000, 10000000

-- LEDGER starts a ledger entry's member in the calendar: no span (a
-- number) nor mark ('-' and a number) starts with it.
local LEDGER = '#'

-- The marks of the last step written, its end and bin: a mark is the same
-- for every take in a step, so its text is made once per step.
local mark_d, mark, bin_mark

-- bucket_add marks the span [c, c + len) busy, merged with the spans that
-- touch it (left, ra: bucket_find's), records task id's ledger entry at c
-- if given, and makes the calendar live until the span ends and keep more
-- (the ledger's entries outlive their slots by keep). A calendar lives
-- until its last span ends and keep: so when a span follows (rb), its life
-- already covers the new one. When none does, the calendar must live until
-- b, the new span's end, and a mark tells whether it does: the member
-- '-' .. d, scored 0, where d is the end of b's step of CAL_LIFE. The take
-- that adds a mark extends the calendar to d and keep; a take
-- that finds its mark there (ZADD CH's count of changed members, in the
-- ZADD that adds the span) needs nothing: nothing shortens a calendar's
-- life, and the mark goes with the calendar. So the calendar is extended
-- once per step, not per take, and lives at most a step longer than its
-- last span. The marks of the steps before stay until the bin's prune: at
-- most a bin's hundred, and no command per step to drop them.
--
-- Beside it goes the mark of d's PRUNE_BIN, '-' .. its number (a step's
-- number is ten million times larger), also scored 0: the take that adds
-- it (both marks new) prunes the calendar: the ledger's entries whose slots
-- ended keep ago, the spans that ended and the marks (every member scored
-- from there to now), and writes the two marks again. A step's mark is never there without its bin's, so the
-- count of changed members tells the three cases apart, and a calendar is
-- pruned once per bin of its life at the cost of one command more. A mark
-- scores 0: no read of the spans or of the ledger from now on sees it, and
-- it keeps a calendar whose spans were all given back from being deleted
-- and made again without a TTL. It returns 0, 1 (a new step) or 2 (a new
-- bin: pruned). The merged span is written before the span it absorbs is
-- removed, so that the set is never emptied (and its TTL lost) on the way.
local function bucket_add(cal, now, c, len, left, ra, rb, keep, id)
  local a, b = left or c, c + len
  if not left and c <= now then a = 0 end -- a span that starts now: see PAST
  local held, at = {}, int(-c) -- the task's ledger entry, written with the span
  if id then held = {at, LEDGER .. id} end
  if rb then
    if ra then b = rb end
    rcall('ZADD', cal, int(b), int(a), unpack_(held))
    if ra then rcall('ZREM', cal, int(ra)) end
    return 0
  end
  local d = (floor(b / CAL_LIFE) + 1) * CAL_LIFE
  if d ~= mark_d then
    mark_d, mark = d, '-' .. int(d)
    bin_mark = '-' .. int(floor(d / PRUNE_BIN))
  end
  -- The span's member always changes (it is new, or its end moves on), and
  -- so does a ledger entry (new, or at a new slot): the rest are marks.
  local new = rcall('ZADD', cal, 'CH', int(b), int(a), '0', mark, '0', bin_mark, unpack_(held)) - 1 - #held / 2
  if new == 0 then return 0 end
  if new == 2 then
    rcall('ZREMRANGEBYSCORE', cal, int(-(now - keep - len)), int(now))
    rcall('ZADD', cal, '0', mark, '0', bin_mark)
  end
  extend(cal, ceil_ms(d - now + keep)) -- after the prune, which may empty the set
  return new
end

-- bucket_free marks [v, v + len) free again, where a span holds it whole;
-- the span's part before v is kept only while it is ahead of now.
local function bucket_free(cal, v, len, now)
  local z = rcall('ZRANGEBYSCORE', cal, '(' .. int(v), '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
  if #z == 0 then return end
  local a, b = tonum(z[1]), tonum(z[2])
  if a > v or b < v + len then return end
  -- The part after first, so that the set is never emptied (and its TTL
  -- lost) while a part remains.
  if b > v + len then rcall('ZADD', cal, int(b), int(v + len)) end
  if a < v and v > now then
    rcall('ZADD', cal, int(v), int(a))
  else
    rcall('ZREM', cal, int(a))
  end
end

-- bucket_hold records a ticket in the tickets set at slot v, and keeps the
-- set alive until the slot has ended and keep more.
local function bucket_hold(set, id, now, v, len, keep)
  rcall('ZADD', set, int(v), id)
  extend(set, ceil_ms(v + len - now + keep))
end

-- ledger_hold records in the ledger that the task goes in slot v, which
-- the calendar holds: the calendar lives as long as the entry must.
local function ledger_hold(cal, id, v)
  rcall('ZADD', cal, int(-v), LEDGER .. id)
end

-- bucket_held returns the slot the ledger holds for the task, or nil: none,
-- or one that has ended; and whether the ledger has the task at all (an
-- ended slot: the task was let go before, see 'g' in the plan).
local function bucket_held(cal, id, now, len)
  local s = rcall('ZSCORE', cal, LEDGER .. id)
  if not s then return nil, false end
  s = -tonum(s)
  if s + len > now then return s, true end
  return nil, true
end

-- bucket_check returns the wait until the task may go (false if now, or if
-- the task holds its slot), how long until the take would pass (that wait,
-- or for a held slot the wait until it may go), remaining (how many takes
-- like it could go now after it), whether the task holds the take, and for
-- bucket_commit the slot, what bucket_find found around it, whether the
-- ledger already records the task at the slot, and whether it had the task
-- at a slot that ended (let go before: see 'g' in the plan).
--
-- When an earlier take of the task already denies, nothing will be written:
-- the ledger is not read, and the take counts as not held. That saves a
-- command on the most common path of a busy fleet, a recipient's quota
-- denying.
--
-- last is the plan's max wait when this take is its last and an admitted
-- task commits at once (it neither books nor only checks), else nil. Then
-- whether the task is admitted is known here: nothing before denied, and
-- after this take nothing can; so when the slot is within last, the ledger
-- is read by writing it, ZADD NX: 1 records a task it did not hold, saving
-- the read a new task's admission would make (ZSCORE); 0 means the ledger
-- has the task, and only then is its slot read. The state is what check
-- then commit would leave. unheld, when set, is the longest window of the
-- task's first take, a quota in which it holds no entry: a slot that ends
-- within that of its entry's moment is not held either, and neither read
-- is made (the commit writes the ledger's entry with the span): see
-- docs/design.md for a task whose first quota changed.
local function bucket_check(t, cal, id, now, prio, denied, last, unheld)
  local len, slack = bucket_len(t), bucket_slack(t, prio)
  -- The task holds no slot (see unheld above): a slot ends at most its
  -- slack and length after the moment its entry was stamped at.
  local known = unheld and unheld >= len + bucket_slack(t, true)
  local early = not denied and last and not known
  local mine, ran = nil, false
  if not denied and not early and not known then mine, ran = bucket_held(cal, id, now, len) end
  local v, left, ra, rb = bucket_find(cal, now, len)
  local wrote = false
  if early then
    if v and v - slack - now <= last and rcall('ZADD', cal, 'NX', int(-v), LEDGER .. id) == 1 then
      wrote = true
    else
      mine, ran = bucket_held(cal, id, now, len)
    end
  end
  if mine then
    local left_ = 0
    if v then left_ = max(0, floor((now + slack - v) / len) + 1) end
    return false, max(0, mine - slack - now), left_, true, mine
  end
  if not v then return left - now, left - now, 0, false, nil, nil, nil, nil, nil, ran end -- (left: how far the search got)
  local wait = max(0, v - slack - now)
  local left_ = floor((now + slack - v) / len)
  if left_ < 0 then left_ = 0 end
  if wait == 0 then wait = false end
  return wait, wait or 0, left_, false, v, left, ra, rb, wrote, ran
end

-- STEP_PRUNE_RATE (takes a second): a bucket faster than this has its ledger
-- pruned at each step of its calendar's life (bucket_commit), at most ten
-- times a second, so at most 0.1 command per take more. A slower one leaves
-- it to the bin's prune (bucket_add): at most 1,000 entries of 10 s, under
-- a millisecond, and no command per take more (at 20/s the step's prune
-- would cost one every other take).
local STEP_PRUNE_RATE = 100

-- bucket_commit gives the task slot v (found by bucket_check or bucket_find)
-- and records it in the ledger with the span (wrote: bucket_check already
-- did).
local function bucket_commit(t, cal, id, now, v, left, ra, rb, keep, wrote)
  local len = bucket_len(t)
  if wrote then id = nil end
  if bucket_add(cal, now, v, len, left, ra, rb, keep, id) == 1 and t.rate > STEP_PRUNE_RATE then
    -- A new step of the calendar's life on a fast bucket: the ledger's
    -- entries whose slots ended keep ago go, a step's worth at a time,
    -- rather than a whole 10 s bin's in one call, which stalled Redis for
    -- 130-210 ms at 60,000 takes a second. (This take's own entry is ahead
    -- of now.)
    rcall('ZREMRANGEBYSCORE', cal, int(-(now - keep - len)), '(0')
  end
end

-- bucket_give gives back the slot [s, s + len) of a bucket (key: its state
-- hash), unless it has ended or a pause (p in the state hash) covers it:
-- the provider asked for no sends then, and a slot freed inside the pause
-- would be the first that the next booking finds.
local function bucket_give(key, cal, s, len, now)
  if s + len <= now then return end
  local p = tonum(rcall('HGET', key, 'p'))
  if not p or p <= s then bucket_free(cal, s, len, now) end
end

-- bucket_undo removes the task's ledger entry; with refund its slot is
-- given back (bucket_give). With refund false (forget: the provider took
-- the send) the slot stays taken and a retry takes a new one.
local function bucket_undo(t, key, cal, id, now, refund)
  local len = bucket_len(t)
  local s = bucket_held(cal, id, now, len)
  if not s then return false end
  rcall('ZREM', cal, LEDGER .. id)
  if refund then bucket_give(key, cal, s, len, now) end
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
-- wait, a cluster's floor): it must fit every window from now's to the one
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
