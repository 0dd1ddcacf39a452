-- repace.lua: moves the wake-up of one waiting task after its provider's
-- rate changed (see repace.go), unless the task moved on since it was read.
--
--   keys  -> its queue's retry set[, the wake set that holds its wake-up,
--            the caller's wake set of the queue]
--   args  -> the task ID, its score as read, its new score (the Unix second
--            it is due)[, its wake-up as read and its new wake-up (Unix ms),
--            with the wake sets]
--
-- A wake-up moves to the caller's set, whose Waker looks at its new time.
--
-- Returns 1 if it moved the task, 0 if the task no longer waits there with
-- that score (it ran, or was deferred again).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if KEYS[2] then
  local wake = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if not wake or tonumber(wake) ~= tonumber(ARGV[4]) then return 0 end
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
return 1
