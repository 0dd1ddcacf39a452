-- admit.lua (after rules.lua): admits one task through every take, or none.
--
-- KEYS and ARGV as described in rules.lua.
--
-- Every take is checked first; only if all pass is anything written, so a
-- denied task leaves no trace (pruning entries that have already left their
-- windows is not a trace of it). A take that already holds this task ID
-- passes without consuming again, which makes a redelivered task idempotent.
--
-- A bucket that is short of tokens may be reserved ahead (tokens go negative)
-- when ARGV[2] allows that wait and nothing else denies: the task is admitted
-- and told the moment it may go. Quota entries and bucket ledgers record that
-- moment, so a repeated call returns the same moment.
--
-- Returns {allowed (1/0), now_us, delay_us, binding take (1-based, 0: none),
--          remaining, repeated (1/0), binding window of a quota (1-based, 0),
--          fresh}
-- where delay_us is, if allowed, the wait until the reserved moment (0: now)
-- and, if denied, the wait until every take would pass; the binding take is
-- the one that sets that wait; remaining is the least capacity left over the
-- takes; repeated says every take already held this task; fresh has one
-- character per take, '1' where this call consumed it (so a caller undoing
-- this call undoes only those, never what the task already held).

local id, maxwait, remember = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_us()
local takes = parse()

local denied, reserve = false, 0
local delay, binding, remaining, repeated = 0, 0, math.huge, true
for i, t in ipairs(takes) do
  if t.kind == 'q' then
    quota_check(t, id, now)
  elseif t.kind == 'b' then
    bucket_check(t, id, now, remember)
  else
    fixed_check(t, id, now)
  end
  if not t.ok then denied = true end
  local until_ok = math.max(t.delay, t.reserve or 0, t.wait)
  if until_ok > delay then delay, binding = until_ok, i end
  if t.reserve and t.reserve > maxwait then denied = true end
  if t.remaining < remaining then remaining = t.remaining end
  if not t.repeated then repeated = false end
end
if remaining < 0 or remaining == math.huge then remaining = 0 end

if denied then
  local window = 0
  if binding > 0 then window = takes[binding].window or 0 end
  return {0, now, delay, binding, remaining, 0, window, string.rep('0', #takes)}
end

local at = now + delay
local fresh = {}
for i, t in ipairs(takes) do
  fresh[i] = t.repeated and '0' or '1'
  if not t.repeated then
    if t.kind == 'q' then
      quota_commit(t, id, now, at)
    elseif t.kind == 'b' then
      bucket_commit(t, id, now, at, remember)
    else
      fixed_commit(t, id, now)
    end
  end
end
if delay == 0 then binding = 0 end
return {1, now, delay, binding, remaining, repeated and 1 or 0, 0, table.concat(fresh)}
