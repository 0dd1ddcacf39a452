-- hold.lua: a worker's signs of life and the tasks it holds, in one queue.
--
-- A worker holds a task from the moment its handler starts until it ends;
-- reap.lua gives the tasks of a worker that shows no sign of life for a
-- while back to the queue. Every call here is a sign of life: holding a
-- task without one would let a worker back from a long silence be taken
-- for dead with the task it just started.
--
-- KEYS[1] -> <prefix>recovery:{<queue>}:holders, hash: task ID -> worker ID
-- KEYS[2] -> <prefix>recovery:{<queue>}:beats, sorted set: worker ID by
--            its last sign of life, Redis time in ms
-- ARGV[1] -> the worker's ID
-- ARGV[2] -> "beat": a sign of life; ARGV[3...] are tasks the worker has
--            finished, dropped unless another worker holds them now.
--            "take": the worker starts task ARGV[3].
--            "keep": the worker is about to send task ARGV[3]: a sign of
--            life only if it still holds the task.
--            "leave": the worker stops; ARGV[3...] as for "beat". It is
--            no longer counted, alive or dead.
--
-- Returns 1, or 0 for a "keep" of a task the worker no longer holds (it
-- was silent for long enough to be taken for dead, and the task went back
-- to the queue).
local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local me, mode = ARGV[1], ARGV[2]
if mode == "keep" and redis.call("HGET", KEYS[1], ARGV[3]) ~= me then
  return 0
end
if mode == "take" then
  redis.call("HSET", KEYS[1], ARGV[3], me)
elseif mode == "beat" or mode == "leave" then
  for i = 3, #ARGV do
    if redis.call("HGET", KEYS[1], ARGV[i]) == me then
      redis.call("HDEL", KEYS[1], ARGV[i])
    end
  end
end
if mode == "leave" then
  redis.call("ZREM", KEYS[2], me)
else
  redis.call("ZADD", KEYS[2], now, me)
end
return 1
