-- wake.lua: wakes the tasks of one queue whose moment has come, moving them
-- from asynq's retry set to the head of the queue's pending list, and
-- writes the moments of tasks just deferred (see wake.go).
--
--   keys  -> the queue's retry set, its pending list, its beats (hold.lua)
--   args  -> the queue's task key prefix, the most tasks to move in one
--            call, how far ahead of now a task counts as due (ms), how long
--            a worker may be silent and still count as alive (ms; 0: do not
--            list the live workers), then pairs: a task's ID and the moment
--            it is to be woken at (Unix ms of Redis's clock)
--
-- A pair's moment is written as the task's score (in seconds, a fraction
-- for the ms) where asynq's own is later: docs/booking.md, "Waking up". A
-- pair whose task is not in the set (asynq's retry has not landed yet, or
-- the task moved on) is left alone, and returned for the caller to try
-- again while its moment is ahead.
--
-- A task is moved as asynq's Requeue puts a task back (RPUSH: the next one
-- dequeued) and with the fields its forwarder sets (item 7), if it still
-- waits in the retry set with state "retry" and no group.
--
-- Returns {now (ms), tasks moved, the set's next score (ms, -1: none), 1 if
-- more were due than one call moves, the pending list's length, the number
-- of pairs not written n, their task IDs (n of them), then the live
-- workers' IDs (when asked)}.
local retry, pending, beats = KEYS[1], KEYS[2], KEYS[3]
local prefix, batch, ahead, alive = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'

local missing = {}
for i = 5, #ARGV, 2 do
  local id, at = ARGV[i], tonumber(ARGV[i + 1]) / 1000
  local s = redis.call('ZSCORE', retry, id)
  if not s then
    missing[#missing + 1] = id
  elseif tonumber(s) > at then
    redis.call('ZADD', retry, 'XX', at, id)
  end
end

local due = redis.call('ZRANGEBYSCORE', retry, '-inf', (now + ahead) / 1000, 'LIMIT', 0, batch)
local more = #due == batch and 1 or 0
local moved = 0
-- The latest first: each RPUSH goes before the last, so the earliest is
-- dequeued first.
for i = #due, 1, -1 do
  local id = due[i]
  local key = prefix .. id
  local h = redis.call('HMGET', key, 'state', 'group')
  if h[1] == 'retry' and (not h[2] or h[2] == '') and redis.call('ZREM', retry, id) == 1 then
    redis.call('RPUSH', pending, id)
    redis.call('HSET', key, 'state', 'pending', 'pending_since', since)
    moved = moved + 1
  end
end

local next = redis.call('ZRANGE', retry, 0, 0, 'WITHSCORES')
local out = {now, moved, next[2] and math.floor(tonumber(next[2]) * 1000 + 0.5) or -1, more, redis.call('LLEN', pending), #missing}
for _, id in ipairs(missing) do out[#out + 1] = id end
if alive > 0 then
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', beats, now - alive, '+inf')) do out[#out + 1] = w end
end
return out
