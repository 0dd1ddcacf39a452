-- batch.lua: checkpoint one batch of a tick's fan-out once enqueue.lua has
-- enqueued it. A resumed fan-out runs the batch after the checkpoint again,
-- which enqueue.lua's seen sets make harmless: no recipient is skipped or
-- repeated.
--
-- KEYS[1] -> the tick's progress hash
-- KEYS[2] -> the tick's lease
-- KEYS[3] -> the queue's running set
-- ARGV[1] -> this run's lease token
-- ARGV[2] -> lease TTL, ms
-- ARGV[3] -> the position this batch starts at (the progress's pos)
-- ARGV[4] -> the position after it
-- ARGV[5] -> file lines read up to the position after it
-- ARGV[6] -> audience entries in the batch, valid or not
-- ARGV[7] -> invalid entries in the batch (not sent here)
-- ARGV[8] -> "1" when the batch ends the fan-out, "expired" when the
--            fan-out stops because its send-by passed, else "0"
-- ARGV[9] -> TTL of the progress hash, s
-- ARGV[10] -> running member, "<campaign>:<tick>"
-- ARGV[11] -> now, Unix seconds
-- ARGV[12] -> the batch's notifications enqueued
-- ARGV[13] -> the batch's notifications already there
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
redis.call("HSET", KEYS[1], "pos", ARGV[4], "line", ARGV[5])
local totals = {
  redis.call("HINCRBY", KEYS[1], "read", ARGV[6]),
  redis.call("HINCRBY", KEYS[1], "enqueued", ARGV[12]),
  redis.call("HINCRBY", KEYS[1], "existing", ARGV[13]),
  redis.call("HINCRBY", KEYS[1], "invalid", ARGV[7]),
}
redis.call("EXPIRE", KEYS[1], ARGV[9])
if ARGV[8] == "0" then
  redis.call("PEXPIRE", KEYS[2], ARGV[2])
else
  redis.call("HSET", KEYS[1], "done", "1", "finished", ARGV[11])
  if ARGV[8] == "expired" then
    redis.call("HSET", KEYS[1], "expired", "1")
  end
  redis.call("DEL", KEYS[2])
  redis.call("ZREM", KEYS[3], ARGV[10])
end
return totals
