-- rules.lua: the rule kinds, shared by admit.lua and release.lua (the Go side
-- prepends this file to each of them, so no Lua is duplicated).
--
-- Every script that includes it has the same calling convention:
--
--   ARGV[1] -> task ID (never empty, no control characters)
--   ARGV[2] -> max wait in µs a provider bucket may reserve ahead (0: none)
--   ARGV[3] -> how long buckets remember a task ID, in µs
--   ARGV[4] -> number of takes n, then n takes, each:
--                kind, cost, then the kind's limits:
--                'q' (sliding-window quota): #windows, then limit, per_us per window
--                'b' (token bucket):         rate (tokens/s, may be fractional), burst
--                'f' (fixed-window counter): limit, per_us
--   KEYS, in take order: 'q' -> sorted set; 'b' -> state hash, ledger sorted set;
--                        'f' -> hash.
--
-- Limits travel as arguments on every call, never stored, so a changed limit
-- applies at once to the history already in Redis.
--
-- All times are µs from Redis TIME: doubles hold them exactly (< 2^53). Numbers
-- go back to Redis through num(), because Lua's default formatting keeps only
-- 14 significant digits and would round µs timestamps.

local function num(x)
  return string.format('%.17g', x)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function ceil_ms(us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return num(ms)
end

-- extend makes key live at least ceil_ms(us) from now, never shorter than it
-- already does: a plain admission must not cut short a key that holds an
-- entry reserved further ahead. (PEXPIRE GT would skip a key with no TTL yet.)
local function extend(key, us)
  local ms = ceil_ms(us)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- parse reads the takes from ARGV[4..] and KEYS.
local function parse()
  local takes, ai, ki = {}, 5, 1
  for i = 1, tonumber(ARGV[4]) do
    local t = {kind = ARGV[ai], cost = tonumber(ARGV[ai + 1]), wait = 0, repeated = false}
    ai = ai + 2
    if t.kind == 'q' then
      t.key = KEYS[ki]; ki = ki + 1
      t.limits, t.pers, t.longest = {}, {}, 0
      for w = 1, tonumber(ARGV[ai]) do
        t.limits[w] = tonumber(ARGV[ai + 2 * w - 1])
        t.pers[w] = tonumber(ARGV[ai + 2 * w])
        if t.pers[w] > t.longest then t.longest = t.pers[w] end
      end
      ai = ai + 1 + 2 * #t.limits
    elseif t.kind == 'b' then
      t.key, t.ledger = KEYS[ki], KEYS[ki + 1]; ki = ki + 2
      t.rate, t.burst = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1]); ai = ai + 2
    elseif t.kind == 'f' then
      t.key = KEYS[ki]; ki = ki + 1
      t.limit, t.per = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1]); ai = ai + 2
    else
      return redis.error_reply('throttle: unknown rule kind ' .. tostring(t.kind))
    end
    takes[i] = t
  end
  return takes
end

-- members lists the sorted-set members a quota take of this cost occupies:
-- the ID itself, then ID\31k for k = 2..cost (IDs carry no control characters).
local function members(id, cost)
  local m = {id}
  for k = 2, cost do m[k] = id .. '\31' .. k end
  return m
end

-- Sliding-window quota. An entry with score s counts in a window of length P
-- at time t while s > t - P; entries older than the longest window are pruned.
-- A denied take waits until enough of the entries in its window have left:
-- the need-th oldest one leaves at s + P.
local function quota_check(t, id, now)
  redis.call('ZREMRANGEBYSCORE', t.key, '-inf', num(now - t.longest))
  local mine = redis.call('ZSCORE', t.key, id)
  if mine then
    t.repeated = true
    t.wait = math.max(0, tonumber(mine) - now)
  end
  t.ok, t.delay, t.remaining = true, 0, math.huge
  for w = 1, #t.limits do
    local lo = '(' .. num(now - t.pers[w])
    local c = redis.call('ZCOUNT', t.key, lo, '+inf')
    local left = t.limits[w] - c
    if not mine then
      local need = c + t.cost - t.limits[w]
      if need > 0 then
        local e = redis.call('ZRANGEBYSCORE', t.key, lo, '+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
        local d = tonumber(e[2]) + t.pers[w] - now
        t.ok = false
        if d > t.delay then t.delay, t.window = d, w end
      else
        left = left - t.cost
      end
    end
    if left < t.remaining then t.remaining = left end
  end
end

local function quota_commit(t, id, now, at)
  local m = members(id, t.cost)
  local args = {}
  for i = 1, #m do
    args[2 * i - 1] = num(at)
    args[2 * i] = m[i]
  end
  redis.call('ZADD', t.key, unpack(args))
  extend(t.key, at - now + t.longest)
end

-- quota_undo removes the task's entries and sets the key's life back to
-- what the remaining entries need (an emptied set is gone on its own).
local function quota_undo(t, id, now)
  if redis.call('ZREM', t.key, unpack(members(id, t.cost))) == 0 then return false end
  local last = redis.call('ZRANGE', t.key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', t.key, ceil_ms(tonumber(last[2]) - now + t.longest))
  end
  return true
end

-- Token bucket. The state hash holds tokens (t, may be negative while
-- reservations are outstanding) and the µs time they were counted (u); an
-- absent hash is a full bucket, so the hash expires once it would be full.
-- The ledger remembers which task IDs hold tokens and the moment each may use
-- them, for idempotent retakes and for exact refunds.
local function bucket_tokens(t, now)
  local st = redis.call('HMGET', t.key, 't', 'u')
  local tokens, last = tonumber(st[1]), tonumber(st[2])
  if not tokens or not last then return t.burst end
  -- A clock that went back (a failover to a node whose clock is behind) adds nothing.
  if now > last then tokens = tokens + (now - last) * t.rate / 1e6 end
  if tokens > t.burst then tokens = t.burst end
  return tokens
end

local function bucket_store(t, now, tokens)
  if tokens >= t.burst then
    redis.call('DEL', t.key)
    return
  end
  redis.call('HSET', t.key, 't', num(tokens), 'u', num(now))
  redis.call('PEXPIRE', t.key, ceil_ms((t.burst - tokens) * 1e6 / t.rate))
end

local function bucket_check(t, id, now, remember)
  redis.call('ZREMRANGEBYSCORE', t.ledger, '-inf', num(now - remember))
  t.tokens = bucket_tokens(t, now)
  t.ok, t.delay = true, 0
  local mine = redis.call('ZSCORE', t.ledger, id)
  if mine then
    t.repeated = true
    t.wait = math.max(0, tonumber(mine) - now)
    t.remaining = math.max(0, math.floor(t.tokens))
  elseif t.tokens >= t.cost then
    t.remaining = math.floor(t.tokens - t.cost)
  else
    -- Not enough tokens: the wait until there are. admit.lua decides whether
    -- the caller may reserve them (wait <= max wait) or is denied.
    t.reserve = math.ceil((t.cost - t.tokens) * 1e6 / t.rate)
    t.remaining = math.max(0, math.floor(t.tokens))
  end
end

local function bucket_commit(t, id, now, at, remember)
  bucket_store(t, now, t.tokens - t.cost)
  redis.call('ZADD', t.ledger, num(at), id)
  extend(t.ledger, at - now + remember)
end

local function bucket_undo(t, id, now)
  if not redis.call('ZSCORE', t.ledger, id) then return false end
  bucket_store(t, now, math.min(t.burst, bucket_tokens(t, now) + t.cost))
  redis.call('ZREM', t.ledger, id)
  return true
end

-- Fixed-window counter: windows are aligned to the epoch. The hash holds the
-- window start (w), the count (n) and, per task ID counted in the window,
-- its cost ('i:' .. id, so no ID can be mistaken for w or n). fixed_state
-- returns the window start, its count, and this task's cost or nil.
local function fixed_state(t, id, now)
  local start = now - now % t.per
  local st = redis.call('HMGET', t.key, 'w', 'n', 'i:' .. id)
  if tonumber(st[1]) ~= start then return start, 0, false end
  return start, tonumber(st[2]) or 0, tonumber(st[3])
end

local function fixed_check(t, id, now)
  local start, n, mine = fixed_state(t, id, now)
  t.start, t.count, t.ok, t.delay = start, n, true, 0
  t.remaining = t.limit - n
  if mine then
    t.repeated = true
  elseif n + t.cost > t.limit then
    t.ok, t.delay = false, start + t.per - now
  else
    t.remaining = t.remaining - t.cost
  end
end

local function fixed_commit(t, id, now)
  if t.count == 0 then redis.call('DEL', t.key) end
  redis.call('HSET', t.key, 'w', num(t.start), 'n', num(t.count + t.cost), 'i:' .. id, num(t.cost))
  redis.call('PEXPIRE', t.key, ceil_ms(t.start + t.per - now))
end

-- fixed_undo gives back the cost the task was counted with.
local function fixed_undo(t, id, now)
  local start, n, mine = fixed_state(t, id, now)
  if not mine then return false end
  if n - mine <= 0 then
    redis.call('DEL', t.key)
  else
    redis.call('HSET', t.key, 'n', num(n - mine))
    redis.call('HDEL', t.key, 'i:' .. id)
  end
  return true
end
