-- batch.lua: enqueue one batch of a tick's notifications and checkpoint
-- the fan-out, all at once: after a crash the progress says exactly which
-- recipients were enqueued, so a resumed fan-out neither skips nor repeats.
--
-- Each notification is enqueued as asynq's Client.Enqueue does (item 3 of
-- the contract in internal/asynqdb, which pins the asynq version): unless
-- its task hash exists, HSET msg, state and pending_since, then LPUSH its
-- ID on the queue's pending list.
-- A recipient already in the tick's seen set, or whose task exists, is
-- "already there" (a duplicate line or SSCAN repeat, or a task enqueued
-- otherwise).
--
-- KEYS[1] -> the tick's progress hash
-- KEYS[2] -> the tick's lease
-- KEYS[3] -> the tick's seen set
-- KEYS[4] -> asynq:{<queue>}:pending
-- KEYS[5] -> the queue's running set
-- ARGV[1] -> this run's lease token
-- ARGV[2] -> lease TTL, ms
-- ARGV[3] -> the position this batch starts at (the progress's pos)
-- ARGV[4] -> the position after it
-- ARGV[5] -> file lines read up to the position after it
-- ARGV[6] -> audience entries in the batch, valid or not
-- ARGV[7] -> invalid entries in the batch (not sent here)
-- ARGV[8] -> "1" when the batch ends the fan-out, "expired" when the
--            fan-out stops because its send-by passed, else "0"
-- ARGV[9] -> TTL of the progress hash and seen set, s
-- ARGV[10] -> asynq:{<queue>}:t: (the task hash prefix)
-- ARGV[11] -> now, Unix ns (pending_since, as asynq's Client writes it)
-- ARGV[12] -> running member, "<campaign>:<tick>"
-- ARGV[13] -> now, Unix seconds
-- ARGV[14...] -> recipient, task ID, task message; repeated
--
-- Returns {read, enqueued, existing, invalid}, the fan-out's totals, or an
-- error starting "LOST" when the lease is no longer this run's, or "MOVED"
-- when the progress is not at ARGV[3]: another run went on from here.
if redis.call("GET", KEYS[2]) ~= ARGV[1] then
  return redis.error_reply("LOST the fan-out's lease")
end
if (redis.call("HGET", KEYS[1], "pos") or "") ~= ARGV[3] then
  return redis.error_reply("MOVED the fan-out's progress is not where this batch starts")
end
local enqueued, existing = 0, 0
for i = 14, #ARGV, 3 do
  local task = ARGV[10] .. ARGV[i + 1]
  if redis.call("SADD", KEYS[3], ARGV[i]) == 0 or redis.call("EXISTS", task) == 1 then
    existing = existing + 1
  else
    redis.call("HSET", task, "msg", ARGV[i + 2], "state", "pending", "pending_since", ARGV[11])
    redis.call("LPUSH", KEYS[4], ARGV[i + 1])
    enqueued = enqueued + 1
  end
end
redis.call("HSET", KEYS[1], "pos", ARGV[4], "line", ARGV[5])
local totals = {
  redis.call("HINCRBY", KEYS[1], "read", ARGV[6]),
  redis.call("HINCRBY", KEYS[1], "enqueued", enqueued),
  redis.call("HINCRBY", KEYS[1], "existing", existing),
  redis.call("HINCRBY", KEYS[1], "invalid", ARGV[7]),
}
redis.call("EXPIRE", KEYS[1], ARGV[9])
if ARGV[8] == "0" then
  redis.call("PEXPIRE", KEYS[2], ARGV[2])
  redis.call("EXPIRE", KEYS[3], ARGV[9])
else
  redis.call("HSET", KEYS[1], "done", "1", "finished", ARGV[13])
  if ARGV[8] == "expired" then
    redis.call("HSET", KEYS[1], "expired", "1")
  end
  redis.call("DEL", KEYS[2], KEYS[3])
  redis.call("ZREM", KEYS[5], ARGV[12])
end
return totals
