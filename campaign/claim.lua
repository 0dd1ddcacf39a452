-- claim.lua: take the lease of one tick's fan-out, so that one worker at a
-- time runs it, and return where it stands.
--
-- KEYS[1] -> the tick's progress hash
-- KEYS[2] -> the tick's lease
-- KEYS[3] -> the queue's running set
-- ARGV[1] -> this run's lease token
-- ARGV[2] -> lease TTL, ms
-- ARGV[3] -> running member, "<campaign>:<tick>"
-- ARGV[4] -> the tick, Unix seconds (the member's score)
-- ARGV[5] -> TTL of the progress hash, s
-- ARGV[6] -> now, Unix seconds
-- ARGV[7] -> "start": run it, from its progress if it has some (the fan-out
--            task); "resume": take over only a fan-out that has progress
--            (a worker that found it abandoned in the running set)
--
-- Returns {"ok", field, value, ...} (the progress hash) when the lease is
-- taken, or {"done"} (finished before), {"busy"} (another run holds the
-- lease) or {"gone"} (nothing left to resume: its progress expired).
if redis.call("HGET", KEYS[1], "done") == "1" then
  redis.call("ZREM", KEYS[3], ARGV[3])
  return {"done"}
end
if ARGV[7] == "resume" and redis.call("EXISTS", KEYS[1]) == 0 then
  -- Resuming from scratch could send again what was sent before the
  -- progress expired: drop it instead.
  redis.call("ZREM", KEYS[3], ARGV[3])
  return {"gone"}
end
if not redis.call("SET", KEYS[2], ARGV[1], "NX", "PX", ARGV[2]) then
  return {"busy"}
end
redis.call("HSETNX", KEYS[1], "started", ARGV[6])
redis.call("EXPIRE", KEYS[1], ARGV[5])
redis.call("ZADD", KEYS[3], ARGV[4], ARGV[3])
local out = redis.call("HGETALL", KEYS[1])
table.insert(out, 1, "ok")
return out
