-- enqueue.lua: enqueue a batch's notifications of one shard of the
-- campaign's queue, before batch.lua checkpoints the batch: each as asynq's
-- Client.Enqueue does (item 3 of internal/asynqdb's contract). A recipient
-- in the tick's seen set, or whose task exists, is "already there" (a
-- repeated line, or this batch run again after a crash or a lost lease).
--
-- KEYS[1] -> the tick's seen set in this shard
-- KEYS[2] -> asynq:{<shard>}:pending
-- ARGV[1] -> asynq:{<shard>}:t: (the task hash prefix)
-- ARGV[2] -> now, Unix ns (pending_since, as asynq's Client writes it)
-- ARGV[3] -> TTL of the seen set, s
-- ARGV[4...] -> recipient, task ID, task message; repeated
--
-- Returns the IDs of the tasks it enqueued; the others were there.
local enqueued = {}
for i = 4, #ARGV, 3 do
  local task = ARGV[1] .. ARGV[i + 1]
  if redis.call("SADD", KEYS[1], ARGV[i]) == 1 and redis.call("EXISTS", task) == 0 then
    redis.call("HSET", task, "msg", ARGV[i + 2], "state", "pending", "pending_since", ARGV[2])
    redis.call("LPUSH", KEYS[2], ARGV[i + 1])
    enqueued[#enqueued + 1] = ARGV[i + 1]
  end
end
redis.call("EXPIRE", KEYS[1], ARGV[3])
return enqueued
