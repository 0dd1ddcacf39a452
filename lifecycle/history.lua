-- history.lua: add one event to its message's history, once.
--
-- A history is the message's events as JSON, in the order they were
-- recorded, but for its accepted event, which goes first whenever it comes:
-- the API records it just after the enqueue, by which time a worker may
-- have recorded the message's first outcome. An event found among the
-- latest few (the same outcome recorded again, after a worker died and its
-- task ran again) is not added twice; one recorded again later is, and
-- readers keep the first of an ID (Recorder.History). Over the limit, the
-- oldest after the first goes: the first says how the message was
-- accepted, and with which idempotency key, which the others are read with.
--
-- KEYS[1] -> the message's history (a list)
-- ARGV[1] -> the event's ID
-- ARGV[2] -> the event, JSON, which opens with its ID: {"id":"<ID>",...
-- ARGV[3] -> "1" for an accepted event (it goes first), else "0"
-- ARGV[4] -> the most events kept, at least 2
-- ARGV[5] -> ms the history lives after this event
--
-- Returns 1 if the event was added, 0 if the history had it.

local RECENT = 8 -- how many of the latest are looked through for the event

local function holds(history, id)
  local opening = '{"id":"' .. id .. '"'
  for _, event in ipairs(redis.call("LRANGE", history, -RECENT, -1)) do
    if string.sub(event, 1, #opening) == opening then
      return true
    end
  end
  return false
end

local function place(history, event, first)
  if first then
    return redis.call("LPUSH", history, event)
  end
  return redis.call("RPUSH", history, event)
end

-- prune drops the second event, the oldest after the first: LSET marks it
-- with "", which no event is, and LREM takes the one mark out.
local function prune(history)
  redis.call("LSET", history, 1, "")
  redis.call("LREM", history, 1, "")
end

local history = KEYS[1]
local added = 0
if not holds(history, ARGV[1]) then
  if place(history, ARGV[2], ARGV[3] == "1") > tonumber(ARGV[4]) then
    prune(history)
  end
  added = 1
end
redis.call("PEXPIRE", history, ARGV[5])
return added
