-- book.lua (after rules.lua, before admit.lua): booking, for a task whose
-- plan says 'k' (or 'K': priority). A task that may not go within its max
-- wait is given the earliest moment every one of its rules allows, counting
-- every moment already booked on the same recipient and provider, and holds
-- it under its ID until it comes back to claim it.
--
-- A plan that books has quotas and at most one bucket (throttle.Request
-- checks that). What a booking holds:
--
--   - on each quota: the task's entry, at the booked moment. The entries of
--     a recipient are booked in order (a new one never goes before one
--     already booked), so the earliest moment for a new entry is after the
--     newest one and after, in each window, the entry that must leave for it
--     to fit: one read of the newest entries, whatever waits.
--   - on the bucket: a ticket in its bookings set (member: task ID, score:
--     the moment), and the bucket's booking tail v (in its state hash) moves
--     one slot (1/rate per token of cost) past it. The tokens themselves are
--     taken only when the task claims its moment: the bucket's tokens stay
--     the provider's truth, and a booking is a place in line. A task that
--     arrives while v is ahead books after it, so tasks waiting on one
--     provider go in the order they booked and each wakes when its turn
--     comes, not when the next token does.
--
-- A claim (the task comes back holding a ticket or booked quota entries)
-- takes the bucket's tokens when they are there, leaving one for each
-- ticket booked before it and not yet claimed (before its booked moment if
-- so: a slot a job missed is used by the next, not lost), and moves the
-- quota entries there if they are not there already, only if they still
-- fit every window (entries booked after them included).
-- It goes if that moment is within max wait. A task that came back early is
-- told its moment again, unchanged. One that came back late, or whose
-- tokens went to others meanwhile (priority traffic), or whose entries no
-- longer fit, books again from the end of the line: what it held is given
-- back first, so arrivals at the provider and at the recipient follow the
-- rules whatever the lateness.
--
-- Priority: a bucket may keep a reserve of tokens that only priority tasks
-- may take (bucket_need). Priority tasks skip the line (they do not wait
-- behind v) and push v one slot on, so that later bookings make room for
-- them; bookings already made absorb the shift within their max wait.
--
-- A booking whose moment would fall after the task's deadline is not made:
-- the task is told it expired, and the moment it would have had.
--
-- A bucket's bookings set keeps tickets nobody claimed (a task deleted
-- while booked) for GRACE after their moment at most: each booking prunes
-- the older ones.

local GRACE = 600000000 -- µs: 10 minutes

-- A task the ledger holds for a moment more than LATE ago claims again
-- (see book_task).
local LATE = 1000000 -- µs

-- Outcomes, the fifth value admit returns for a task.
local DECIDED, BOOKED, EXPIRED, REBOOKED = 0, 1, 2, 3

-- Scratch per take: the key index of each take, a quota's held entry.
local KI, QH = {}, {}

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

-- quota_fits reports whether the task's entry, moved to x, fits every
-- window of quota t given every other entry, earlier or later: for each
-- window of length P, every window (s - P, s] that would hold x (s from x
-- to x + P) holds at most limit - cost others. The count only grows at an
-- entry, so s = x and s = each other entry in [x, x + P) are the windows to
-- count. A large quota is not read: it does not fit (the task books again).
local function quota_fits(t, key, id, x)
  if t.most > QREAD then return false end
  local lo, hi = fmt('(%.17g', x - t.longest), fmt('(%.17g', x + t.longest)
  local z = rcall('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', '0', int(4 * QREAD))
  if #z >= 8 * QREAD then return false end
  local n = 0
  for j = 1, #z, 2 do
    if not mine(z[j], id) then
      n = n + 1
      SC[n] = tonum(z[j + 1])
    end
  end
  local nw = t.nw
  for w = 1, nw do
    local room, per = t[w] - t.cost, t[nw + w]
    for j = 0, n do
      local s = x
      if j > 0 then s = SC[j] end
      if s >= x and s < x + per then
        local c = 0
        for i = 1, n do
          if SC[i] > s - per and SC[i] <= s then c = c + 1 end
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
-- shared: every subject of the zone may be held for it. Bookings for it are
-- placed one slot apart after it, in order, however many there are (so the
-- morning after quiet hours is paced by the provider, not a stampede):
-- after it by a slot for each ticket booked in the SHARED that follow it.
local SHARED = 86400000000 -- µs: a day

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

local function fits_at(t, key, id, x)
  if t.kind == 'c' then return cal_fits(t, key, id, x) end
  return quota_fits(t, key, id, x)
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

-- ticket_add records the task's booking on a bucket.
local function ticket_add(book, id, now, at)
  rcall('ZADD', book, int(at), id)
  rcall('ZREMRANGEBYSCORE', book, '-inf', int(now - GRACE))
  extend(book, ceil_ms(at - now + GRACE))
end

-- book_task admits a booking task whose keys start at keys[ki]. It returns
-- false when the task's bucket ledger already holds it (a task admitted
-- before and delivered again: admit_task's plain path answers that), else
-- the index past its last key and its six values (see admit.lua).
local function book_task(keys, ki, id, p, now, deadline, floor_)
  local n, maxwait, remember, prio = p.n, p.maxwait, p.remember, p.prio
  -- floor: on a cluster, the quotas' call books no earlier than the moment
  -- the bucket's node gave (book_bucket's peek); 0 elsewhere.
  local base = max(now, floor_ or 0)
  local bt, bi, bkey, bledger, bbook
  local k = ki
  for i = 1, n do
    KI[i] = k
    if p[i].kind == 'b' then
      bt, bi, bkey, bledger, bbook = p[i], i, keys[k], keys[k + 1], keys[k + 2]
    end
    k = k + p[i].nk
  end
  if bt then
    local s = bucket_held(bledger, id, now, remember)
    if s and s >= now - LATE then return false end
    if s then
      -- It took its tokens for a moment long gone and never went (its
      -- worker died after the claim): sent now on them, it would crowd the
      -- moments granted since. They go back, and it claims again.
      bucket_undo(bt, bkey, bledger, id, now, remember, true)
    end
  end

  -- What the task holds: a ticket, booked quota entries.
  local ticket, held = nil, 0
  if bt then
    ticket = rcall('ZSCORE', bbook, id)
    ticket = ticket and tonum(ticket)
    if ticket then held = ticket end
  end
  for i = 1, n do
    local s = entry_held(p[i], keys[KI[i]], id, now)
    QH[i] = s or false
    if s and s > held then held = s end
  end

  local tokens, e, v, wait = nil, nil, nil, 0
  if bt then
    tokens, e, v = bucket_tokens(bt, bkey, bledger, now)
    wait = bucket_wait(bt, bkey, bledger, now, tokens, bucket_need(bt, prio))
  end
  -- A slot in whole µs, so that the tail is stored exactly.
  local slot = 0
  if bt then slot = ceil(bt.cost * 1e6 / bt.rate) end
  local outcome = BOOKED

  if ticket or held > 0 then
    -- A claim.
    if held > now + maxwait then
      -- Early: the moment stands.
      return k, 0, now, held - now, 0, BOOKED, 0
    end
    -- Tokens are taken when a claim is made, up to max wait before its
    -- moment: a claim leaves what the tickets booked before its moment and
    -- not yet claimed need, or claims made early for later moments would
    -- take the tokens of earlier ones.
    local after, pace = 0, wait -- the moment after the last of those tickets
    if bt and held > now then
      local before = rcall('ZCOUNT', bbook, int(now), '(' .. int(held))
      if before > 0 then
        local need = bucket_need(bt, prio) + before
        if tokens < need then pace = max(wait, ceil((need - tokens) * 1e6 / bt.rate)) end
        local last = rcall('ZREVRANGEBYSCORE', bbook, '(' .. int(held), int(now), 'WITHSCORES', 'LIMIT', '0', '1')
        after = tonum(last[2]) + slot
      end
    end
    -- It goes when its tokens are there, before its booked moment if the
    -- line leaves them (the tickets before it keep theirs): a slot another
    -- job missed is not lost. Not before a quota entry that does not fit
    -- earlier.
    local x = max(now + pace, base, after)
    for i = 1, n do
      local s = QH[i]
      if s and s > x and not p[i].count and not fits_at(p[i], keys[KI[i]], id, x) then x = s end
    end
    -- Not in quiet hours: at its booked moment, which was not.
    for i = 1, n do
      if p[i].kind == 'h' and held > x and quiet_end(p[i], x) then x = held end
    end
    local fits = true
    for i = 1, n do
      if not fits then break end
      local t = p[i]
      if t.count then -- it goes wherever the others let it
      elseif t.kind == 'q' or t.kind == 'c' then
        local s = QH[i]
        if s then
          if s ~= x and not fits_at(t, keys[KI[i]], id, x) then fits = false end
        elseif earliest(t, keys[KI[i]], now) > x then
          fits = false
        end
      elseif t.kind == 'h' and quiet_end(t, x) then
        fits = false
      end
    end
    if fits and x > now + maxwait and held >= now then
      -- Its moment has not passed, but its tokens come later than max
      -- wait (the line before it is tight): it keeps its place and comes
      -- back then.
      return k, 0, now, x - now, 0, BOOKED, 0
    end
    fits = fits and x <= now + maxwait
    if fits then
      local fresh, bit = 0, 65536
      for i = 1, n do
        local t = p[i]
        if t.kind == 'q' or t.kind == 'c' then
          if not QH[i] then
            fresh = fresh + bit
            entry_commit(t, keys[KI[i]], id, now, x)
          elseif QH[i] ~= x then
            entry_move(t, keys[KI[i]], id, now, x)
          end
        elseif t.kind == 'h' then
          fresh = fresh + bit
        else
          fresh = fresh + bit
          bucket_commit(t, bkey, bledger, id, now, x, remember, tokens, e, v)
          rcall('ZREM', bbook, id)
        end
        bit = bit * 2
      end
      return k, 1 + fresh, now, x - now, 0, DECIDED, ticket or held
    end
    -- Late, or the tokens went elsewhere: give it all back, book again.
    for i = 1, n do
      if QH[i] then entry_undo(p[i], keys[KI[i]], id, now) end
    end
    if ticket then rcall('ZREM', bbook, id) end
    outcome = REBOOKED
  end

  -- A new booking: the earliest moment every rule allows.
  local m, binding, window, shared = base, 0, 0, false
  for i = 1, n do
    local t = p[i]
    if t.count then -- it sets no moment
    elseif t.kind == 'q' then
      local q, w = quota_earliest(t, keys[KI[i]], now)
      if q > m then m, binding, window, shared = q, i, w, false end
    elseif t.kind == 'c' then
      local q, edge = cal_earliest(t, keys[KI[i]], now)
      if q > m then m, binding, window, shared = q, i, 0, edge end
    end
  end
  local pb = now
  if bt then
    pb = now + wait
    if not prio and v and v > pb then pb = v end
    if pb > m then m, binding, window, shared = pb, 0, 0, false end
  end
  -- Out of quiet hours; a shared moment after the bookings made for it.
  for _ = 1, 4 do
    for i = 1, n do
      local e = p[i].kind == 'h' and quiet_end(p[i], m)
      if e then m, binding, window, shared = e, i, 0, true end
    end
    if not (shared and bt) then break end
    shared = false
    local c = rcall('ZCOUNT', bbook, int(m), '(' .. int(m + SHARED))
    if c == 0 then break end
    m = m + c * slot
  end
  if bt and binding == 0 then binding = bi end
  if deadline > 0 and m > deadline then
    return k, 4 * binding + 256 * window, now, m - now, 0, EXPIRED, 0
  end
  local far = beyond(p, m)
  if far then
    if binding == 0 then binding = far end
    return k, 4 * binding + 256 * window, now, m - now, 0, DECIDED, 0
  end
  -- The tail moves past this task when the bucket set its moment (a task
  -- the recipient holds back later takes its tokens out of line, and
  -- bookings absorb that slot within their max wait). A priority task
  -- pushes the tail by its slot when there is a line.
  local tail = v
  if bt then
    if prio then
      if v and v > now then tail = v + slot end
    elseif m - pb < slot then
      if m + slot > (tail or 0) and (m > now + maxwait or (v and v > now)) then tail = m + slot end
    end
  end
  if m <= now + maxwait then
    -- It may go within max wait after all: admitted.
    local fresh, bit = 0, 65536
    for i = 1, n do
      local t = p[i]
      fresh = fresh + bit
      if t.kind == 'q' or t.kind == 'c' then
        entry_commit(t, keys[KI[i]], id, now, m)
      elseif t.kind == 'b' then
        bucket_commit(t, bkey, bledger, id, now, m, remember, tokens, e, tail)
      end
      bit = bit * 2
    end
    if m == now then binding, window = 0, 0 end
    return k, 1 + 4 * binding + 256 * window + fresh, now, m - now, 0, DECIDED, 0
  end
  local ahead = 0
  for i = 1, n do
    local t = p[i]
    if t.kind == 'q' or t.kind == 'c' then
      entry_commit(t, keys[KI[i]], id, now, m)
    end
  end
  if bt then
    ticket_add(bbook, id, now, m)
    if tail ~= v then bucket_store(bt, bkey, now, tokens, nil, tail) end
    ahead = rcall('ZCOUNT', bbook, '-inf', '(' .. int(m))
  else
    for i = 1, n do
      if i == binding and (p[i].kind == 'q' or p[i].kind == 'c') then
        ahead = rcall('ZCOUNT', keys[KI[i]], '(' .. int(now), '(' .. int(m))
      end
    end
  end
  return k, 4 * binding + 256 * window, now, m - now, 0, outcome, ahead
end

-- book_bucket (Redis Cluster): the bucket's part of a booking, whose quotas
-- live on another node. A cluster books in three calls: peek here for the
-- moment the bucket would give (a claimer's: its ticket, or when its tokens
-- are there), book the quotas on their node no earlier than that (admit,
-- with that floor), then commit here at the moment they took:
--
--   args  -> 'peek' or 'commit', the task's ID, a plan of its one bucket
--            take (see rules.lua, with 'k' or 'K'), and for commit the
--            moment (µs)
--   keys  -> the bucket's keys
--
-- peek returns {now, moment, ticket (0: none), 1 if the ledger holds the
-- task (it was admitted before: the plain path answers)}. commit returns
-- {now, 0, moment} when it took the tokens for the moment (the task goes),
-- {now, 1, ahead} when it booked it, and {now, 2, when the tokens are
-- there} when the moment is within max wait but the tokens are not there by
-- then (taken since the peek): the caller gives the quotas back and starts
-- again. The line and the tokens follow the rules of book_task.
local function book_bucket(keys, args)
  if not rcall then bind() end
  memo = false
  local now = now_us()
  local mode, id, p = args[1], args[2], plan(args[3])
  local bt = p[1]
  if p.n ~= 1 or bt.kind ~= 'b' then
    return redis.error_reply('throttle: book_bucket needs one bucket take')
  end
  local bkey, bledger, bbook = keys[1], keys[2], keys[3]
  local maxwait, prio = p.maxwait, p.prio
  local tokens, e, v = bucket_tokens(bt, bkey, bledger, now)
  local ticket = rcall('ZSCORE', bbook, id)
  ticket = ticket and tonum(ticket)
  local wait = bucket_wait(bt, bkey, bledger, now, tokens, bucket_need(bt, prio))
  if ticket and ticket > now then
    local need = bucket_need(bt, prio) + rcall('ZCOUNT', bbook, int(now), '(' .. int(ticket))
    if tokens < need then wait = max(wait, ceil((need - tokens) * 1e6 / bt.rate)) end
  end
  local pb = now + wait
  if ticket then
    pb = max(pb, ticket)
  elseif not prio and v and v > pb then
    pb = v
  end
  if mode == 'peek' then
    local held = 0
    if bucket_held(bledger, id, now, p.remember) then held = 1 end
    return {now, pb, ticket or 0, held}
  end
  local at = tonum(args[4])
  local slot = ceil(bt.cost * 1e6 / bt.rate)
  local tail = v
  if prio then
    if v and v > now then tail = v + slot end
  elseif not ticket and at - pb < slot then
    if at + slot > (tail or 0) and (at > now + maxwait or (v and v > now)) then tail = at + slot end
  end
  if at <= now + maxwait then
    if now + wait > at then return {now, 2, now + wait} end
    bucket_commit(bt, bkey, bledger, id, now, at, p.remember, tokens, e, tail)
    if ticket then rcall('ZREM', bbook, id) end
    return {now, 0, at}
  end
  ticket_add(bbook, id, now, at)
  if tail ~= v then bucket_store(bt, bkey, now, tokens, nil, tail) end
  return {now, 1, rcall('ZCOUNT', bbook, '-inf', '(' .. int(at))}
end
