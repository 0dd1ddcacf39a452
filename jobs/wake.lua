-- wake.lua: moves the booked tasks of one queue whose wake-up is due from
-- asynq's retry set to the head of the queue's pending list (see wake.go).
--
--   keys  -> the queue's wake set (task ID -> wake-up, Unix ms of Redis's
--            clock), its retry set, its pending list
--   args  -> its task key prefix, the most tasks to move in one call, how
--            far ahead of now a wake-up counts as due (ms), how long after
--            it is due a wake-up waits for its task to leave active (ms)
--
-- A task is moved as asynq's Requeue puts a task back (RPUSH: the next one
-- dequeued) and with the fields its forwarder sets. A task still active
-- (deferred by its handler, but asynq's Retry has not yet run) is left for
-- a later call, for a while: one active that long was run by other means
-- (asynq's own wake-up, the dashboard's run now) and is noted again if it
-- is deferred again. Any other (woken already, done, deleted, one of
-- asynq's groups) loses its wake-up. Returns {tasks moved, now in ms, wake-ups
-- kept for tasks still active}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + tonumber(ARGV[3]), 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local moved, kept = 0, 0
-- The latest first: each RPUSH goes before the last, so the earliest is
-- dequeued first.
for i = #due - 1, 1, -2 do
  local id = due[i]
  local key = ARGV[1] .. id
  local h = redis.call('HMGET', key, 'state', 'group')
  if h[1] == 'active' and tonumber(due[i + 1]) + tonumber(ARGV[4]) > now then
    -- its handler's deferral is on its way to the retry set
    kept = kept + 1
  else
    redis.call('ZREM', KEYS[1], id)
    if h[1] == 'retry' and (not h[2] or h[2] == '') and redis.call('ZREM', KEYS[2], id) == 1 then
      redis.call('RPUSH', KEYS[3], id)
      redis.call('HSET', key, 'state', 'pending', 'pending_since', since)
      moved = moved + 1
    end
  end
end
return {moved, now, kept}
