-- pause.lua (after rules.lua and book.lua): one entry point, pause, that
-- pauses a token bucket for every caller, for a provider that answered "429
-- Too Many Requests, Retry-After: d".
--
--   args  -> the pause in µs, then a plan (see rules.lua) of one bucket take
--   keys  -> the bucket's keys
--
-- The pause is busy time in the bucket's calendar: [now, end + slack), so
-- that no slot handed out after it lets a take go before the pause ends
-- (a slot may be used up to the bucket's slack before it starts). Slots
-- already in the ledger are not taken back (their tasks may be sending);
-- tickets in it are, when claimed: the state hash's p records the end, and
-- a claim that would go before it books again (see book.lua). A release
-- does not free a slot the pause covers (bucket_undo).
--
-- Returns {µs until the first slot after the pause may be used}.

local function pause(keys, args)
  if not rcall then bind() end
  local us = tonum(args[1])
  local now = now_us()
  local p = plan(args[2])
  local t = p[1]
  if p.n ~= 1 or t.kind ~= 'b' then
    return redis.error_reply('throttle: pause needs one bucket take')
  end
  local key, cal = keys[1], keys[4]
  local e = now + us
  local a, b = now, e + bucket_slack(t, true)
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
  local old = tonum(rcall('HGET', key, 'p'))
  if not old or old < e then
    rcall('HSET', key, 'p', int(e))
    extend(key, ceil_ms(e - now + GRACE))
  end
  return {ceil(b - bucket_slack(t, true) - now)}
end
