-- enqueue.lua: enqueue a batch's notifications of one shard of the
-- campaign's queue (jobs.AsynqQueue), before batch.lua checkpoints the
-- batch. Run again for the same recipients (the run that enqueued them
-- died before its checkpoint, or lost its lease), it enqueues nothing:
-- the shard's seen set of the tick remembers every recipient enqueued.
--
-- Each notification is enqueued as asynq's Client.Enqueue does (item 3 of
-- the contract in internal/asynqdb, which pins the asynq version): unless
-- its task hash exists, HSET msg, state and pending_since, then LPUSH its
-- ID on the queue's pending list. A recipient already in the seen set, or
-- whose task exists, is "already there" (a duplicate line or SSCAN repeat,
-- a task enqueued otherwise, or this batch run before).
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
