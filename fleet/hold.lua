-- hold.lua: a worker's signs of life and the tasks it holds, in one queue,
-- wherever a call must be a sign of life. A worker holds a task from the
-- moment its handler starts until it ends; reap.lua gives the tasks of a
-- worker that shows no sign of life for a while back to the queue.
--
-- A task is held as a member "<task ID>:<n>" of the worker's own set, n
-- counting the worker's takes (docs/design.md, "Dead workers"). After a
-- silence the worker takes here, the sign of life and the member in one
-- call; while its signs of life are fresh, with a plain SADD (Member.take).
--
-- KEYS[1] -> <prefix>recovery:{<queue>}:held:<worker ID>, set of members
-- KEYS[2] -> <prefix>recovery:{<queue>}:beats, sorted set: worker ID by
--            its last sign of life, Redis time in ms
-- ARGV[1] -> the worker's ID
-- ARGV[2] -> "beat": a sign of life; ARGV[3...] are members of runs that
--            have ended, dropped.
--            "take": the worker starts the run ARGV[3].
--            "keep": the worker is about to send in run ARGV[3]: a sign of
--            life only if it still holds it.
--            "leave": the worker stops: it holds nothing and is no longer
--            counted, alive or dead (asynq requeues what its server still
--            had at shutdown).
--
-- Returns 1, or 0 for a "keep" of a run the worker no longer holds (it was
-- silent for long enough to be taken for dead, and the task went back to
-- the queue).
local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local me, mode = ARGV[1], ARGV[2]
if mode == "keep" and redis.call("SISMEMBER", KEYS[1], ARGV[3]) == 0 then
  return 0
end
if mode == "take" then
  redis.call("SADD", KEYS[1], ARGV[3])
elseif mode == "beat" then
  -- In slices: unpack puts each argument on Lua's stack.
  for i = 3, #ARGV, 1000 do
    redis.call("SREM", KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
end
if mode == "leave" then
  redis.call("DEL", KEYS[1])
  redis.call("ZREM", KEYS[2], me)
else
  redis.call("ZADD", KEYS[2], now, me)
end
return 1
