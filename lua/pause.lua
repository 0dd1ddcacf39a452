-- pause.lua (after rules.lua, book.lua and repace.lua): one entry point, pause, that
-- pauses a token bucket for every caller, for a provider that answered "429
-- Too Many Requests, Retry-After: d".
--
--   args  -> the pause in µs, then a plan (see rules.lua) of one bucket take
--   keys  -> the bucket's keys
--
-- The pause is busy time in the bucket's calendar: [now, end + slack), so
-- that no slot handed out after it lets a take go before the pause ends.
-- The waiting work first shifts by the time the pause adds (move_waiting in
-- repace.lua), except the slots already taken to go (in_flight). A pause
-- that ends no later than one already recorded moves nothing. The state
-- hash's p records the end. Why: docs/booking.md, "A provider's pause".
--
-- Returns {µs until the first slot after the pause may be used}.

-- in_flight is the end of the slots already taken to go by now (their
-- start within the slack of now: their tasks may be sending), at least now:
-- the calendar up to it stays where it is, the waiting work after it moves.
local function in_flight(cal, now, slack, len)
  local m = now
  -- The ledger's entries (scored -V) of the slots starting in that span.
  local z = rcall('ZRANGEBYSCORE', cal, int(-(now + slack)), '(' .. int(-(now - len)), 'WITHSCORES')
  for j = 2, #z, 2 do
    local e = -tonum(z[j]) + len
    if e > m then m = e end
  end
  return m
end

local function pause(keys, args)
  if not rcall then bind() end
  local us = tonum(args[1])
  local now = now_us()
  local p = plan(args[2])
  local t = p[1]
  if p.n ~= 1 or t.kind ~= 'b' then
    return redis.error_reply('throttle: pause needs one bucket take')
  end
  local key, cal = keys[1], keys[3]
  local e = now + us
  local slack = bucket_slack(t, true)
  local a, b = now, e + slack
  local old = tonum(rcall('HGET', key, 'p'))
  local pivot = in_flight(cal, now, slack, bucket_len(t))
  local was = pivot -- where the waiting line resumes today
  if old and old + slack > was then was = old + slack end
  if b > was then
    move_waiting(keys, now, now + slack, now + BUMP_MARGIN + slack, shifting(pivot, b - was), bucket_len({cost = 1, rate = t.rate}))
  end
  -- The spans that overlap [a, b) merge into one.
  local z = rcall('ZRANGEBYSCORE', cal, '(' .. int(a), '+inf', 'WITHSCORES')
  for j = 1, #z, 2 do
    local s, f = tonum(z[j]), tonum(z[j + 1])
    if s > b then break end
    rcall('ZREM', cal, z[j])
    if s < a then a = s end
    if f > b then b = f end
  end
  rcall('ZADD', cal, int(b), int(a))
  extend(cal, ceil_ms(b - now))
  if not old or old < e then
    rcall('HSET', key, 'p', int(e))
    extend(key, ceil_ms(e - now + GRACE))
  end
  return {ceil(b - bucket_slack(t, true) - now)}
end
