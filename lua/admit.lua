-- admit.lua (after rules.lua and book.lua): the two entry points that
-- decide a task, through every one of its takes or none.
--
--   admit  admits it: it goes now (or after a wait its max wait allows a
--          bucket to reserve), or is denied
--   book   books it: a task that may not go within its max wait holds the
--          earliest moment its rules allow instead (book.lua)
--
--   admit args -> three: the task's ID (never empty, no control
--                 characters), its plan (see rules.lua) and its floor (µs
--                 of Redis time: the earliest moment it may go at; on a
--                 cluster, the moment its bucket's node gave, see
--                 throttle/cluster.go; 0: now)
--   book args  -> seven: its ID, its plan (which says 'k' or 'K'), its
--                 floor, its deadline (µs, 0: none), weight, tenant, and
--                 '1' when it is back from a place in its tenant's line
--                 ('0' otherwise)
--   keys       -> the takes' keys, in take order (with the task's done
--                 marker first where its plan says 'd'); on a cluster the
--                 second subject's may follow the arguments (rules.lua's
--                 task_keys)
--
-- Every take is checked first and only if all pass is anything written; a
-- take the task already holds passes without consuming again. A bucket
-- short of tokens may be reserved ahead within the plan's max wait. Why:
-- docs/design.md, "Algorithms" (All or nothing, idempotent, no trace).
--
-- A task whose plan has a done marker (see rules.lua) whose key exists is
-- done: nothing is checked or consumed.
--
-- Returns ten integers, one value each (throttle's parseGroup reads them in
-- this order):
--
--    1 outcome    0 denied, 1 admitted, 2 repeated (admitted, every take
--                 held already), 3 booked, 4 booked again (it came back too
--                 late for its moment, or its moment was taken), 5 placed
--                 in its tenant's line (beyond its bucket's horizon: nothing
--                 held), 6 expired (its moment would be after its deadline:
--                 nothing held), 7 done (its done marker exists); numbered as
--                 throttle.Outcome numbers them
--    2 binding    the take that sets delay_us (1-based within the task's
--                 takes; 0: none)
--    3 window     the binding quota's window that sets it (1-based; 0:
--                 none, or the binding take is not a quota)
--    4 fresh      the takes this call consumed, bit i-1 for take i (a
--                 request has at most 32 takes), so that a caller undoing
--                 this call undoes only those, never what the task already
--                 held
--    5 now_us     Redis time of the call
--    6 delay_us   admitted: the wait until the moment it may go (0: now);
--                 booked, placed or expired: until its moment (or the one it
--                 would have had); denied: until every take would pass
--    7 remaining  the least capacity left over the takes
--    8 extra      booked or placed: how many bookings on the binding rule
--                 come before it (in line: about how many sends); an
--                 admitted claim: the moment it had booked (µs); else 0
--    9 shadow     the take in shadow mode ('?', see rules.lua) that would
--                 have held the task back longest (1-based; 0: none)
--   10 shadow_us  how long it would have held it back (µs)

-- never_booked reports that a task holds none of its recipient's entries
-- on one of its quotas or calendars (found: what the checks found): a
-- booking takes every take at once, so it never booked, and holds no
-- ticket either. (A booking's entries leave a quota a window after its
-- moment; a task back that late finds its ticket's slot long past, and
-- goes as a new task.) The ticket needs no read then: the most common
-- booking admission, a task that goes at once, saves a command.
local function never_booked(p, found)
  for i = 1, p.n do
    local k = p[i].kind
    if (k == 'q' or k == 'c') and not found[i].held then return true end
  end
  return false
end

-- goes_plain reports whether a booking task whose check passed now (go)
-- goes the plain way: it holds nothing, no ticket on its bucket among
-- them (a ticket it claims: the ledger entry its check wrote goes). That
-- costs what a plain admission costs; anything else is booking's (see
-- book.lua). keys[ki] is the task's first take's key; found[i] what the
-- check found of take i.
local function goes_plain(keys, ki, id, p, go, found)
  local kb, unbooked = ki, never_booked(p, found)
  for i = 1, p.n do
    if not go then return false end
    if p[i].kind == 'b' and not unbooked and rcall('ZSCORE', keys[kb + 1], ticket_member(id, p[i].cost)) then
      if found[i][5] then rcall('ZREM', keys[kb + 2], LEDGER .. id) end
      return false
    end
    if found[i].held then return false end
    kb = kb + p[i].nk
  end
  return go
end

-- commit_takes writes every take the task does not hold yet, as its check
-- found it (found[i]: see check_take), for it to go delay µs from now, and
-- moves there the entries of the takes in moves (see admit_task). It
-- returns the takes it consumed (fresh).
local function commit_takes(keys, ki, id, p, now, delay, found, moves)
  local at = now + delay
  local fresh, bit, k = 0, 1, ki
  for i = 1, p.n do
    local t = p[i]
    local kind = t.kind
    local f = found[i]
    if moves and moves[i] then
      entry_move(t, keys[k], id, now, at)
    elseif not f.held then
      fresh = fresh + bit
      if kind == 'q' then
        quota_commit(t, keys[k], id, now, at, f[1], f[2])
      elseif kind == 'b' then
        bucket_commit(t, keys[k + 2], id, now, f[1], f[2], f[3], f[4], p.remember, f[5])
      elseif kind == 'c' then
        cal_commit(t, keys[k], id, now, at)
      end
    end
    k = k + t.nk
    bit = bit * 2
  end
  return fresh
end

-- check_take checks take t of a task whose keys start at keys[k] (see
-- bucket_check for last). It returns ok, the take's delay, the window that
-- set it (0: none), its remaining capacity, what it found (a table: held,
-- whether the task holds the take; [1..5], what its commit needs, by kind)
-- and the index past its keys. A count-only take is recorded, never holds
-- the task back.
local function check_take(t, keys, k, id, now, p, span, denied, last, unheld)
  local kind = t.kind
  local ok, u, w, left, mine, a, b, c, d, e, ran = true, 0, 0
  if kind == 'q' then
    ok, u, w, left, mine, a, b = quota_check(t, keys[k], id, now)
  elseif kind == 'b' then
    local reserve
    reserve, u, left, mine, a, b, c, d, e, ran = bucket_check(t, keys[k + 2], id, now, p.book and p.prio, denied, last, unheld)
    if reserve and reserve > p.maxwait then ok = false end
  elseif kind == 'c' then
    ok, u, left, mine = cal_check(t, keys[k], id, now, span)
  else -- 'h': holds nothing, so it never makes a task new
    ok, u = quiet_check(t, now, span)
    left, mine = huge, nil
  end
  local found = {held = mine, ran = ran, u = u, a, b, c, d, e}
  if t.shadow and not ok then found.would = u end -- what it would have done
  if t.count then ok, u, w, left = true, 0, 0, huge end -- recorded, never holding
  return ok, u, w, left, found, k + t.nk
end

-- below_floor returns, by take, the first key of each quota or calendar
-- take the task holds at a moment before at, which must move there (a
-- cluster's recipient stamped before its bucket set a later moment, see
-- throttle/cluster.go), and the take that does not fit there if one does
-- not (0: all fit; nil, 0: none to move).
local function below_floor(keys, ki, id, p, now, at, found)
  local moves, k = nil, ki
  for i = 1, p.n do
    local t, f = p[i], found[i]
    if f.held and (t.kind == 'q' or t.kind == 'c') and now + f.u < at then
      if not t.count and not fits_at(t, keys[k], id, at, nil, 0) then return nil, i end
      moves = moves or {}
      moves[i] = true
    end
    k = k + t.nk
  end
  return moves, 0
end

-- check_task checks every take of a task whose keys start at keys[ki] (a:
-- its arguments; lead: how far its floor is ahead of now; plain: whether it
-- may go the plain way; marker: its done marker, to look for where its
-- first take finds it held). It returns what the checks made of it: found
-- (per take, see check_take), denied, delay, binding, window, remaining,
-- repeated, held, the shadow rule that would have held it back longest
-- (shadow, shadow_u), and done, when its marker was found (the checks stop
-- there, before any take writes).
local function check_task(keys, ki, p, now, a, lead, plain, marker)
  local c = {found = {}, denied = false, delay = lead, binding = 0, window = 0, remaining = huge,
    repeated = true, held = false, shadow = 0, shadow_u = 0}
  local span = max(p.maxwait, lead) -- how far after now a take may be stamped
  local k = ki
  -- A task that holds no entry of its first take, a quota, took nothing
  -- that lasts no longer than the quota's longest window (unheld): every
  -- take is written at once (see bucket_check). On a cluster the quota's
  -- node may have said so ('N' in the plan).
  local unheld = p.unheld
  for i = 1, p.n do
    local t = p[i]
    local last -- a bucket's reach when it is the last take and the task commits at once
    if t.kind == 'b' and i == p.n and not p.dry and plain and lead == 0 then
      if not p.book then
        last = p.maxwait
      elseif not c.denied and c.delay == 0 and not c.held then
        last = 0 -- it goes now unless it holds a ticket (undone below)
      end
    end
    local ok, u, w, left, f
    ok, u, w, left, f, k = check_take(t, keys, k, a.id, now, p, span, c.denied, last, unheld)
    if p.guard and f.ran then
      -- Let go before, and its marker is read on another node: writing
      -- now would overwrite the ledger's record of that slot. The caller
      -- asks again without 'g' if the task is not marked. (The bucket is
      -- the first take of a booking's first call, the last where its
      -- master serves the recipient's slot too.)
      c.done = true
      return c
    end
    if i == 1 and t.kind == 'q' and not t.count then
      if marker and f.held and rcall('EXISTS', marker) == 1 then
        c.done = true -- looked for only now: see 'D' in rules.lua
        return c
      end
      if not f.held then unheld = t.longest end
    end
    c.found[i] = f
    if f.held then c.held = true end
    if not ok then c.denied = true end
    if u > c.delay then c.delay, c.binding, c.window = u, i, w end
    if left < c.remaining then c.remaining = left end
    if not f.held and t.kind ~= 'h' then c.repeated = false end
    if f.would and (c.shadow == 0 or f.would > c.shadow_u) then c.shadow, c.shadow_u = i, f.would end
  end
  if c.remaining < 0 or c.remaining == huge then c.remaining = 0 end
  return c
end

-- settle decides a task its checks found c (see check_task): it books (a
-- plan that books and may not go the plain way), is denied, or goes.
local function settle(keys, ki, p, now, a, c, lead, plain)
  local found, denied, delay, binding, window = c.found, c.denied, c.delay, c.binding, c.window
  if p.book and not goes_plain(keys, ki, a.id, p, plain and not denied and delay == 0, found) then
    local r = book_task(keys, ki, p, now, a)
    if r then return r end
  end
  local moves
  if lead > 0 and c.held and not denied then
    local misfit
    moves, misfit = below_floor(keys, ki, a.id, p, now, now + delay, found)
    if misfit > 0 then denied, binding, window = true, misfit, 0 end
  end
  if denied then
    return reply(DENIED, binding, window, 0, now, delay, c.remaining, 0)
  end
  if delay == lead then binding, window = 0, 0 end
  local outcome = c.repeated and REPEATED or ADMITTED
  if p.dry then -- a check only (shadow mode's): the decision, nothing written
    return reply(outcome, binding, window, 0, now, delay, c.remaining, 0)
  end
  local fresh = commit_takes(keys, ki, a.id, p, now, delay, found, moves)
  return reply(outcome, binding, window, fresh, now, delay, c.remaining, 0)
end

-- admit_task decides the task whose keys start at keys[ki] (a: its
-- arguments, see the entry points) and returns its answer (see reply in
-- book.lua). Its moment is no earlier than its floor: a quota entry is
-- stamped there (a cluster's quota node commits at the moment the bucket's
-- node gave), and its checks cover now to then.
local function admit_task(keys, ki, p, now, a)
  local marker
  if p.done then marker, ki = keys[ki], ki + 1 end
  local done = marker and not p.lazy and rcall('EXISTS', marker) == 1
  local lead = max(0, a.floor - now)
  -- A task that books may still go the plain way only now, from no floor,
  -- before its deadline, holding nothing.
  local plain = not p.book or lead == 0 and (a.deadline == 0 or now <= a.deadline)
  local c
  if not done then
    c = check_task(keys, ki, p, now, a, lead, plain, p.lazy and marker)
    done = c.done
  end
  if done then return reply(DONE, 0, 0, 0, now, 0, 0, 0) end
  local r = settle(keys, ki, p, now, a, c, lead, plain)
  r[9], r[10] = c.shadow, c.shadow_u
  return r
end

-- decide runs admit_task on the task of args, read into its arguments by
-- read.
local function decide(keys, args, read, book)
  if not rcall then bind() end
  local err
  keys, err = task_keys(keys, args, book and 7 or 3)
  if err then return redis.error_reply(err) end
  local p = plan(args[2])
  if (p.book or false) ~= book then
    return redis.error_reply('throttle: a plan that books goes to book, any other to admit')
  end
  return admit_task(keys, 1, p, now_us(), read(args))
end

local function plain_args(args)
  return {id = args[1], floor = tonum(args[3]) or 0, deadline = 0, weight = 1, tenant = '', back = false}
end

local function book_args(args)
  return {id = args[1], floor = tonum(args[3]) or 0, deadline = tonum(args[4]) or 0,
    weight = tonum(args[5]) or 1, tenant = args[6], back = args[7] == '1'}
end

local function admit(keys, args) return decide(keys, args, plain_args, false) end
local function book(keys, args) return decide(keys, args, book_args, true) end
