-- reap.lua: give the tasks of dead workers back to their queue, as asynq
-- gives back a task its server stops (item 4 of the contract in
-- internal/asynqdb): out of active and lease, onto the head of pending,
-- state "pending", retry count unchanged.
--
-- A worker is dead when its last sign of life (hold.lua) is more than
-- ARGV[1] ms old by Redis's clock. A task it holds (a member of its set,
-- see hold.lua) is moved only if it is still where its dequeue put it: in
-- the lease set, in the active list, with its message; the earliest taken
-- goes first, so it runs first. A task that has ended since (done,
-- retried, archived) is only dropped. The dead workers leave the beats set
-- and their sets go; a worker that was only silent joins the beats again
-- with its next sign of life.
--
-- An active task no live worker holds, whose lease nobody has extended for
-- ARGV[4] s, is an orphan, and goes back the same way; ARGV[4] is more than
-- a dead worker's silence plus asynq's 5 s heartbeat, so it takes none that
-- runs. The live workers' sets are read only when some lease is that stale.
-- Why, and why many reapers at once are safe: docs/design.md, "Dead
-- workers" ("Tasks nobody holds", "The reaper"). The held sets are found by
-- name (ARGV[3] and the worker's ID) and share the queue's hash tag.
--
-- KEYS[1] -> <prefix>recovery:{<queue>}:beats (see hold.lua)
-- KEYS[2] -> asynq:{<queue>}:active
-- KEYS[3] -> asynq:{<queue>}:lease
-- KEYS[4] -> asynq:{<queue>}:pending
-- ARGV[1] -> silence after which a worker is dead, ms
-- ARGV[2] -> asynq:{<queue>}:t: (the task hash prefix)
-- ARGV[3] -> <prefix>recovery:{<queue>}:held: (the held sets' prefix)
-- ARGV[4] -> seconds without a lease extension after which an active task
--            no live worker holds is an orphan
-- ARGV[5..] -> workers found dead in another queue in the same sweep: dead
--            here too if silent here for half ARGV[1] (a worker beats its
--            queues one after another, so its last signs differ by the time
--            that took; one cut off from another queue's node only beats on
--            here)
--
-- Returns, per dead worker: its ID, ms since its last sign of life, the
-- number of tasks moved, then their IDs; then, if orphans were moved, the
-- same for them under the ID "" with ARGV[4] in ms.

-- asynq's lease: now + 30 s at the dequeue, extended to now + 30 s every
-- 5 s while a server runs the task (item 1 of the contract).
local LEASE = 30

-- held returns the task IDs of the members of set key, earliest taken
-- first.
local function held(key)
  local runs = {}
  for _, m in ipairs(redis.call("SMEMBERS", key)) do
    local id, n = string.match(m, "^(.*):(%d+)$")
    if id then
      runs[#runs + 1] = {id = id, n = tonumber(n)}
    end
  end
  table.sort(runs, function(a, b) return a.n < b.n end)
  local ids = {}
  for i, run in ipairs(runs) do
    ids[i] = run.id
  end
  return ids
end

-- requeue moves task id back to the head of pending if it is still where
-- its dequeue put it, and reports whether it did.
local function requeue(id)
  local task = ARGV[2] .. id
  if redis.call("ZSCORE", KEYS[3], id) and redis.call("HGET", task, "msg")
      and redis.call("LREM", KEYS[2], 0, id) > 0 then
    redis.call("ZREM", KEYS[3], id)
    redis.call("RPUSH", KEYS[4], id)
    redis.call("HSET", task, "state", "pending")
    return true
  end
  return false
end

local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)

-- The workers found dead in another queue (ARGV[5..]) and silent here for
-- half the silence that makes a worker dead: their last signs, by worker.
local known_dead = {}
for i = 5, #ARGV do
  local s = tonumber(redis.call("ZSCORE", KEYS[1], ARGV[i]))
  if s and now - s > tonumber(ARGV[1]) / 2 then known_dead[ARGV[i]] = s end
end

-- emit appends one hand-over to out: whose, how long silent, what moved.
local function emit(out, w, silent, moved)
  out[#out + 1] = w
  out[#out + 1] = silent
  out[#out + 1] = #moved
  for _, id in ipairs(moved) do
    out[#out + 1] = id
  end
end

-- held_by_live returns the set of task IDs the workers that showed a sign
-- of life within ARGV[1] ms hold.
local function held_by_live()
  local live = {}
  for _, w in ipairs(redis.call("ZRANGEBYSCORE", KEYS[1], now - tonumber(ARGV[1]), "+inf")) do
    if not known_dead[w] then
      for _, id in ipairs(held(ARGV[3] .. w)) do
        live[id] = true
      end
    end
  end
  return live
end

-- reap_dead moves the tasks of the dead workers (see above). A task a dead
-- worker's set still names that a live worker holds is that worker's run,
-- not the dead one's: the dead worker deferred it (asynq moved it to retry
-- and on to another worker) and died before its set forgot it. It is only
-- dropped: moved back to pending, it would run twice at once.
local function reap_dead(out)
  local dead = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", "(" .. (now - tonumber(ARGV[1])), "WITHSCORES")
  local found = {}
  for i = 1, #dead, 2 do found[dead[i]] = true end
  for w, s in pairs(known_dead) do
    if not found[w] then
      dead[#dead + 1], dead[#dead + 2] = w, s
    end
  end
  local live = #dead > 0 and held_by_live() or {}
  for i = 1, #dead, 2 do
    local w, key, moved = dead[i], ARGV[3] .. dead[i], {}
    for _, id in ipairs(held(key)) do
      if not live[id] and requeue(id) then
        moved[#moved + 1] = id
      end
    end
    redis.call("DEL", key)
    redis.call("ZREM", KEYS[1], w)
    emit(out, w, now - tonumber(dead[i + 1]), moved)
  end
end

-- reap_orphans moves the orphans (see above).
local function reap_orphans(out)
  local after = tonumber(ARGV[4])
  local stale = redis.call("ZRANGEBYSCORE", KEYS[3], "-inf", "(" .. (tonumber(t[1]) + LEASE - after))
  if #stale == 0 then
    return
  end
  local live = held_by_live()
  local moved = {}
  for _, id in ipairs(stale) do
    if not live[id] and requeue(id) then
      moved[#moved + 1] = id
    end
  end
  if #moved > 0 then
    emit(out, "", after * 1000, moved)
  end
end

local out = {}
reap_dead(out)
reap_orphans(out)
return out
