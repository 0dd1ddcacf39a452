-- rescale.lua: moves the moment of one waiting task after its provider's
-- rate or its tenant's weight changed (see rescale.go), unless the task
-- moved on since it was read.
--
--   keys  -> its queue's retry set
--   args  -> the task ID, its score as read, its new score
--
-- Returns 1 if it moved the task, 0 if the task no longer waits there with
-- that score (it ran, or was deferred again).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
return 1
