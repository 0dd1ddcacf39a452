-- repace.lua: moves the wake-up of one task placed in line, after its
-- provider's rate changed (see repace.go), unless the task moved on since
-- it was read.
--
--   keys  -> the task's hash, its queue's retry set (asynqdb: one slot)
--   args  -> the task ID, its place as read, its new place, its new score
--            (the Unix second it is due)
--
-- Returns 1 if it moved the task, 0 if the task no longer waits there with
-- that place (it ran, or was placed again).
if redis.call('HGET', KEYS[1], 'thr') ~= ARGV[2] then return 0 end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'thr', ARGV[3])
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[1])
return 1
