-- reap.lua: give the tasks of dead workers back to their queue, as asynq
-- gives back a task its server stops (item 4 of the contract in
-- internal/asynqdb): out of active and lease, onto the head of pending,
-- state "pending", retry count unchanged.
--
-- A worker is dead when its last sign of life (hold.lua) is more than
-- ARGV[1] ms old by Redis's clock. A task it holds is moved only if it is
-- still where its dequeue put it: in the lease set, in the active list,
-- with its message. A task that has ended since (done, retried, archived)
-- only loses its holder. The dead workers leave the beats set; a worker
-- that was only silent joins it again with its next sign of life. A holder
-- not in the beats set at all left it gracefully (or Redis lost it): its
-- entry goes once the task has ended, and its active tasks are left to
-- asynq, which requeues a task its server stops.
--
-- An active task no worker holds, whose lease nobody has extended for
-- ARGV[3] s, is an orphan, and goes back the same way: its dequeue's reply
-- never reached a worker (Redis was killed after the dequeue, or the worker
-- between its dequeue and its take), so no worker runs it, and asynq's
-- recoverer would give it back only 30 s after its lease expired, a minute
-- or more after the dequeue. A task a live worker runs has its lease
-- extended every 5 s (item 1 of the contract), and one whose take failed
-- is never sent by that worker (its "keep" answers 0), so ARGV[3], more
-- than a dead worker's silence plus the 5 s, takes none that runs.
--
-- Any number of workers may run this at once: each call is atomic on the
-- queue's node, and a task moved by one is no longer held for the next.
--
-- KEYS[1] -> <prefix>recovery:{<queue>}:holders (see hold.lua)
-- KEYS[2] -> <prefix>recovery:{<queue>}:beats
-- KEYS[3] -> asynq:{<queue>}:active
-- KEYS[4] -> asynq:{<queue>}:lease
-- KEYS[5] -> asynq:{<queue>}:pending
-- ARGV[1] -> silence after which a worker is dead, ms
-- ARGV[2] -> asynq:{<queue>}:t: (the task hash prefix)
-- ARGV[3] -> seconds without a lease extension after which an active task
--            no worker holds is an orphan
--
-- Returns, per dead worker: its ID, ms since its last sign of life, the
-- number of tasks moved, then their IDs; then, if orphans were moved, the
-- same for them under the ID "" with ARGV[3] in ms.
local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)

-- asynq's lease: now + 30 s at the dequeue (item 1 of the contract).
local LEASE = 30

-- requeue moves task id from active to the head of pending, as asynq's
-- requeue does, if it is still where its dequeue put it; it reports
-- whether it did.
local function requeue(id)
  local task = ARGV[2] .. id
  if redis.call("ZSCORE", KEYS[4], id) and redis.call("HGET", task, "msg")
      and redis.call("LREM", KEYS[3], 0, id) > 0 then
    redis.call("ZREM", KEYS[4], id)
    redis.call("RPUSH", KEYS[5], id)
    redis.call("HSET", task, "state", "pending")
    return true
  end
  return false
end

-- reap_dead moves the tasks of the dead workers and appends them to out.
local function reap_dead(out)
  local dead = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", "(" .. (now - tonumber(ARGV[1])), "WITHSCORES")
  if #dead == 0 then
    return
  end
  local moved, names = {}, {}
  for i = 1, #dead, 2 do
    moved[dead[i]] = {}
    names[#names + 1] = dead[i]
  end
  local known = {}
  for _, w in ipairs(redis.call("ZRANGE", KEYS[2], 0, -1)) do
    known[w] = true
  end
  local holders = redis.call("HGETALL", KEYS[1])
  for i = 1, #holders, 2 do
    local id, w = holders[i], holders[i + 1]
    if not known[w] then
      if not redis.call("ZSCORE", KEYS[4], id) then
        redis.call("HDEL", KEYS[1], id)
      end
    elseif moved[w] then
      redis.call("HDEL", KEYS[1], id)
      if requeue(id) then
        table.insert(moved[w], id)
      end
    end
  end
  redis.call("ZREM", KEYS[2], unpack(names))
  for i = 1, #dead, 2 do
    local w = dead[i]
    out[#out + 1] = w
    out[#out + 1] = now - tonumber(dead[i + 1])
    out[#out + 1] = #moved[w]
    for _, id in ipairs(moved[w]) do
      out[#out + 1] = id
    end
  end
end

-- reap_orphans moves the orphans (see above) and appends them to out.
local function reap_orphans(out)
  local after = tonumber(ARGV[3])
  local stale = redis.call("ZRANGEBYSCORE", KEYS[4], "-inf", "(" .. (tonumber(t[1]) + LEASE - after))
  local moved = {}
  for _, id in ipairs(stale) do
    if redis.call("HEXISTS", KEYS[1], id) == 0 and requeue(id) then
      moved[#moved + 1] = id
    end
  end
  if #moved == 0 then
    return
  end
  out[#out + 1] = ""
  out[#out + 1] = after * 1000
  out[#out + 1] = #moved
  for _, id in ipairs(moved) do
    out[#out + 1] = id
  end
end

local out = {}
reap_dead(out)
reap_orphans(out)
return out
