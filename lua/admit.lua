-- admit.lua (after rules.lua and book.lua): two entry points.
--
--   admit    admits tasks, each through every one of its takes or none
--   restamp  (cluster only) moves quota entries stamped ahead to the moment
--            the task's provider token was reserved for (see below)
--
-- admit:
--
--   args  -> per task, six: its ID (never empty, no control characters),
--            its plan (see rules.lua), and for a plan that books (the others
--            ignore them): its deadline (µs, Redis time; 0: none), floor
--            (µs; on a cluster, see book_task; 0: none), weight (its fair
--            share) and tenant
--   keys  -> the takes' keys, task after task, in take order
--
-- The tasks are admitted one after another at one Redis time, exactly as if
-- each were admitted by a call of its own: several in one call only save the
-- calls.
--
-- For each task, every take is checked first; only if all pass is anything
-- written, so a denied task leaves no trace (a check reads and never
-- writes: stale entries are pruned by the next admission that writes). A take
-- that already holds this task ID passes without consuming again, which
-- makes a redelivered task idempotent.
--
-- A bucket that is short of tokens may be reserved ahead (tokens go negative)
-- when the plan's max wait allows that wait and nothing else denies: the task
-- is admitted and told the moment it may go. Quota entries and bucket ledgers
-- record that moment, so a repeated call returns the same moment. A plan
-- that books (see book.lua) is booked a moment instead of denied.
--
-- A task whose plan has a done marker (see rules.lua) whose key exists is
-- done: nothing is checked or consumed, its outcome is 5 (done), and its
-- other values are 0 but now_us.
--
-- Returns, for each task in turn, ten integers, one value each (throttle's
-- parseGroup reads them in this order):
--
--    1 allowed    1 if the task may go (now, or after delay_us), else 0
--    2 repeated   1 if every take already held this task, else 0
--    3 binding    the take that sets delay_us (1-based within the task's
--                 takes; 0: none)
--    4 window     the binding quota's window that sets it (1-based; 0:
--                 none, or the binding take is not a quota)
--    5 fresh      the takes this call consumed, bit i-1 for take i (a
--                 request has at most 32 takes), so that a caller undoing
--                 this call undoes only those, never what the task already
--                 held
--    6 now_us     Redis time of the call
--    7 delay_us   if allowed, the wait until the reserved moment (0: now);
--                 if booked (or expired), the wait until the booked moment
--                 (or the one it would have had); if denied, the wait until
--                 every take would pass
--    8 remaining  the least capacity left over the takes
--    9 outcome    0 decided (allowed or denied, as allowed says), 1 booked,
--                 2 expired (its moment would be after its deadline: nothing
--                 held), 3 booked again (it came back too late for its
--                 moment, or its moment was taken), 4 in line (beyond its
--                 bucket's horizon: nothing held, it comes back at its place
--                 in line), 5 done (its done marker exists)
--   10 extra      for a booking, how many bookings on the binding rule come
--                 before it (in line: about how many sends); for an allowed
--                 claim, the moment it had booked (µs); else 0

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
    if p[i].kind == 'b' and not unbooked and rcall('ZSCORE', keys[kb + 2], ticket_member(id, p[i].cost)) then
      if found[i][5] then rcall('ZREM', keys[kb + 1], id) end
      return false
    end
    if found[i].held then return false end
    kb = kb + p[i].nk
  end
  return go
end

-- commit_takes writes every take the task does not hold yet, as its check
-- found it (found[i]: see check_take), for it to go delay µs from now:
-- quota entries no earlier than the plan's ahead (a cluster's quota group
-- whose request reserves a provider token in a later call). It returns the
-- index past the task's last key and the takes it consumed (fresh).
local function commit_takes(keys, ki, id, p, now, delay, found)
  local at = now + delay
  local qat = at
  if p.ahead > 0 and qat < now + p.ahead then qat = now + p.ahead end
  local fresh, bit, k = 0, 1, ki
  for i = 1, p.n do
    local t = p[i]
    local kind = t.kind
    local f = found[i]
    if not f.held then
      fresh = fresh + bit
      if kind == 'q' then
        quota_commit(t, keys[k], id, now, qat, f[1], f[2])
      elseif kind == 'b' then
        bucket_commit(t, keys[k], keys[k + 1], keys[k + 3], id, now, at, f[1], f[2], f[3], f[4], p.remember, f[5])
      elseif kind == 'f' then
        fixed_commit(t, keys[k], id, now, f[1], f[2])
      elseif kind == 'c' then
        cal_commit(t, keys[k], id, now, qat)
      end
    end
    k = k + t.nk
    bit = bit * 2
  end
  return k, fresh
end

-- check_take checks take t of a task whose keys start at keys[k] (see
-- bucket_check for last). It returns ok, the take's delay, the window that
-- set it (0: none), its remaining capacity, what it found (a table: held,
-- whether the task holds the take; [1..5], what its commit needs, by kind)
-- and the index past its keys. A count-only take is recorded, never holds
-- the task back.
local function check_take(t, keys, k, id, now, p, span, denied, last)
  local kind = t.kind
  local ok, u, w, left, mine, a, b, c, d, e = true, 0, 0
  if kind == 'q' then
    ok, u, w, left, mine, a, b = quota_check(t, keys[k], id, now)
  elseif kind == 'b' then
    local reserve
    reserve, u, left, mine, a, b, c, d, e = bucket_check(t, keys[k + 1], keys[k + 3], id, now, p.book and p.prio, denied, last)
    if reserve and reserve > p.maxwait then ok = false end
  elseif kind == 'f' then
    ok, u, left, mine, a, b = fixed_check(t, keys[k], id, now)
  elseif kind == 'c' then
    ok, u, left, mine = cal_check(t, keys[k], id, now, span)
  else -- 'h': holds nothing, so it never makes a task new
    ok, u = quiet_check(t, now, span)
    left, mine = huge, nil
  end
  if t.count then ok, u, w, left = true, 0, 0, huge end -- recorded, never holding
  return ok, u, w, left, {held = mine, a, b, c, d, e}, k + t.nk
end

-- admit_task admits one task whose keys start at keys[ki] and returns its
-- answer (see reply in book.lua), which says where the next task's keys
-- start.
local function admit_task(keys, ki, id, p, now, deadline, floor_, weight, tenant)
  local maxwait, n = p.maxwait, p.n
  local marker
  if p.done then marker, ki = keys[ki], ki + 1 end
  if marker and rcall('EXISTS', marker) == 1 then
    for i = 1, n do ki = ki + p[i].nk end
    return reply(ki, false, false, 0, 0, 0, now, 0, 0, DONE, 0)
  end
  local denied, delay, binding, window, remaining, repeated = false, 0, 0, 0, huge, true
  local span = max(maxwait, p.ahead) -- how far after now a take may be stamped
  -- A task that books may still go the plain way (below) only now, from
  -- no floor, before its deadline, holding nothing.
  local plain = not p.book or (floor_ or 0) <= now and (deadline == 0 or now <= deadline)
  local held = false -- a take before holds the task
  local found, k = {}, ki
  for i = 1, n do
    local t = p[i]
    local last -- a bucket's reach when it is the last take and the task commits at once
    if t.kind == 'b' and i == n and not p.dry and plain then
      if not p.book then
        last = maxwait
      elseif not denied and delay == 0 and not held then
        last = 0 -- it goes now unless it holds a ticket (undone below)
      end
    end
    local ok, u, w, left, f
    ok, u, w, left, f, k = check_take(t, keys, k, id, now, p, span, denied, last)
    found[i] = f
    if f.held then held = true end
    if not ok then denied = true end
    if u > delay then delay, binding, window = u, i, w end
    if left < remaining then remaining = left end
    if not f.held and t.kind ~= 'h' then repeated = false end
  end
  if remaining < 0 or remaining == huge then remaining = 0 end

  if p.book and not goes_plain(keys, ki, id, p, plain and not denied and delay == 0, found) then
    local kk = book_task(keys, ki, id, p, now, deadline, floor_, weight, tenant)
    if kk then return kk end
  end

  if denied then
    return reply(k, false, false, binding, window, 0, now, delay, remaining, DECIDED, 0)
  end
  if p.dry then -- a check only (shadow mode's): the decision, nothing written
    if delay == 0 then binding = 0 end
    return reply(k, true, repeated, binding, window, 0, now, delay, remaining, DECIDED, 0)
  end

  local fresh
  k, fresh = commit_takes(keys, ki, id, p, now, delay, found)
  if delay == 0 then binding = 0 end
  return reply(k, true, repeated, binding, window, fresh, now, delay, remaining, DECIDED, 0)
end

local function admit(keys, args)
  if not rcall then bind() end
  local now = now_us()
  local out, ki = {}, 1
  for j = 1, #args, 6 do
    local p = plan(args[j + 1])
    local r
    if p.book then
      r = admit_task(keys, ki, args[j], p, now, tonum(args[j + 2]), tonum(args[j + 3]),
        tonum(args[j + 4]), args[j + 5])
    else
      r = admit_task(keys, ki, args[j], p, now, 0, 0, 1, '')
    end
    for i = 1, 10 do out[#out + 1] = r[i] end
    ki = r.k
  end
  return out
end

-- restamp (cluster only) moves quota (and calendar) entries a call stamped
-- provisionally (at now + ahead: see the plan's maxwait:ahead in rules.lua)
-- to the moment the request's provider token was reserved for: now + delay, by this node's TIME, never later than the
-- provisional stamp. Only entries the task still holds move (ZADD XX), and
-- the key lives at least until the moved entries leave the longest window.
--
--   args  -> the delay in µs, then per task its ID and plan (see rules.lua)
--   keys  -> the takes' keys, task after task, in take order
--
-- Returns {now_us, takes restamped of task 1, of task 2, ...}.
local function restamp(keys, args)
  if not rcall then bind() end
  local now = now_us()
  local to = now + tonum(args[1])
  local out, ki = {now}, 1
  for j = 2, #args, 2 do
    local id, p = args[j], plan(args[j + 1])
    local moved = 0
    for i = 1, p.n do
      local t = p[i]
      if t.kind == 'q' then
        local key = keys[ki]
        local s = rcall('ZSCORE', key, id)
        s = s and tonum(s)
        if s and s > now - t.longest and to < s then
          local m, zargs = members(id, t.cost), {'XX'}
          for x = 1, #m do
            zargs[2 * x], zargs[2 * x + 1] = int(to), m[x]
          end
          rcall('ZADD', key, unpack_(zargs))
          extend(key, ceil_ms(to - now + t.longest))
          moved = moved + 1
        end
      elseif t.kind == 'c' then
        local s = cal_held(t, keys[ki], id, now)
        if s and to < s then
          entry_move(t, keys[ki], id, now, to)
          moved = moved + 1
        end
      end
      ki = ki + t.nk
    end
    out[#out + 1] = moved
  end
  return out
end
