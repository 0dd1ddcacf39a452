-- wake.lua: moves the booked tasks of one queue whose wake-up is due from
-- asynq's retry set to the head of the queue's pending list (see wake.go).
--
-- Every Waker notes its wake-ups in a set of its own per queue (task ID ->
-- wake-up, Unix ms of Redis's clock) and is listed in the queue's owners set
-- by the time of its last sweep.
--
--   keys  -> the caller's set, the queue's retry set, its pending list, its
--            owners set, the one wake set of the workers before owners
--   args  -> 'look' (the caller's set) or 'sweep' (every set of the queue;
--            see below), the queue's task key prefix, the most tasks to move
--            in one call, how far ahead of now a wake-up counts as due (ms),
--            how long after it is due a wake-up waits for its task to leave
--            active (ms), the caller's ID, the prefix of the owners' sets
--            (their IDs end them), how long an owner may go without a sweep
--            before its set is the caller's (ms), how long before it is
--            suspect (ms), how far ahead a suspect's wake-ups are moved (ms)
--
-- A sweep lists the caller as an owner as of now, moves what is due in every
-- set (an owner that is alive moves its own when due: what a sweep finds
-- there is late, its owner stopped or busy), and adopts the set of each
-- owner silent for longer than the orphan time (killed) if the caller was
-- not, or gone (its time 0): its wake-ups join the caller's, which the
-- caller's looks then follow. A suspect, silent for a sweep missed but not
-- yet adopted, has what falls due before the next sweep moved now: its jobs
-- wake early and sleep for their moments, rather than late.
--
-- A task is moved as asynq's Requeue puts a task back (RPUSH: the next one
-- dequeued) and with the fields its forwarder sets. A task still active
-- (deferred by its handler, but asynq's Retry has not run yet) is left for
-- a later call, for a while: one active that long was run by other means
-- (asynq's own wake-up, the dashboard's run now) and is noted again if it
-- is deferred again. Any other (woken already, done, deleted, one of
-- asynq's groups) loses its wake-up. Returns {tasks moved, now in ms,
-- wake-ups kept for tasks still active, the caller's next wake-up (ms, -1
-- none), 1 if a set held more due than one call moves, wake-ups adopted}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
local mine, retry, pending, owners, shared = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local batch, by, active = tonumber(ARGV[3]), now + tonumber(ARGV[4]), tonumber(ARGV[5])

-- The sets to look in, each with the latest wake-up it moves.
local sets = {{key = mine, by = by}}
local adopted = 0
if ARGV[1] == 'sweep' then
  local me, orphan, suspect = ARGV[6], tonumber(ARGV[8]), tonumber(ARGV[9])
  -- The caller adopts only if it was alive itself (its last sweep is
  -- recent): after Redis was down, or the caller stopped, every other
  -- owner looks silent.
  local alive = tonumber(redis.call('ZSCORE', owners, me) or 0) + orphan >= now
  local listed = redis.call('ZRANGE', owners, 0, -1, 'WITHSCORES')
  redis.call('ZADD', owners, now, me)
  for i = 1, #listed, 2 do
    local o = listed[i]
    if o ~= me then
      local set = ARGV[7] .. o
      local beat = tonumber(listed[i + 1])
      if beat == 0 or alive and beat + orphan < now then
        adopted = adopted + redis.call('ZCARD', set)
        redis.call('ZUNIONSTORE', mine, 2, mine, set, 'AGGREGATE', 'MAX')
        redis.call('DEL', set)
        redis.call('ZREM', owners, o)
      elseif beat + suspect < now then
        sets[#sets + 1] = {key = set, by = now + tonumber(ARGV[10])}
      else
        sets[#sets + 1] = {key = set, by = by}
      end
    end
  end
  sets[#sets + 1] = {key = shared, by = by}
end

-- What is due in each set, the earliest first.
local due, more = {}, 0
for _, set in ipairs(sets) do
  local z = redis.call('ZRANGEBYSCORE', set.key, '-inf', set.by, 'WITHSCORES', 'LIMIT', 0, batch)
  if #z == 2 * batch then more = 1 end
  for i = 1, #z, 2 do
    due[#due + 1] = {id = z[i], at = tonumber(z[i + 1]), set = set.key}
  end
end
table.sort(due, function(a, b) return a.at < b.at end)
if #due > batch then more = 1 end

local moved, kept = 0, 0
-- The latest first: each RPUSH goes before the last, so the earliest is
-- dequeued first.
for i = math.min(#due, batch), 1, -1 do
  local d = due[i]
  local key = ARGV[2] .. d.id
  local h = redis.call('HMGET', key, 'state', 'group')
  if h[1] == 'active' and d.at + active > now then
    -- its handler's deferral is on its way to the retry set
    kept = kept + 1
  else
    redis.call('ZREM', d.set, d.id)
    if h[1] == 'retry' and (not h[2] or h[2] == '') and redis.call('ZREM', retry, d.id) == 1 then
      redis.call('RPUSH', pending, d.id)
      redis.call('HSET', key, 'state', 'pending', 'pending_since', since)
      moved = moved + 1
    end
  end
end

local next = redis.call('ZRANGE', mine, 0, 0, 'WITHSCORES')
return {moved, now, kept, next[2] and tonumber(next[2]) or -1, more, adopted}
