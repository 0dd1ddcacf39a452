-- release.lua (after rules.lua and book.lua): two entry points, release and
-- forget, that give back what a task's admission took.
--
--   args  -> the task's ID and its plan (see rules.lua; the max wait is not
--            used)
--   keys  -> the takes' keys, in take order (on a cluster, the second
--            subject's may follow the arguments: rules.lua's task_keys)
--
-- Only takes that hold the task ID are undone, so releasing twice, or
-- releasing a task that was never admitted, changes nothing; nor does an
-- entry that no longer counts (a quota entry out of every window, a bucket
-- slot that has ended). A bucket's slot is freed for the next take (unless
-- a pause covers it: see bucket_undo). Either also drops a booking the task
-- holds on a bucket, and frees its slot.
--
-- forget is release for a send the provider took (a 429 or 5xx answer): the
-- task's bucket ledger entries are removed and their slots stay taken, so
-- that a retry takes a new slot rather than passing as already held. Quotas
-- and calendars are left as they are.
--
-- Both return {now_us, takes undone}.

local function undo_task(keys, args, refund)
  if not rcall then bind() end
  local err
  keys, err = task_keys(keys, args, 2)
  if err then return redis.error_reply(err) end
  local now = now_us()
  local id, p = args[1], plan(args[2])
  local undone, ki = 0, 1
  for i = 1, p.n do
    local t = p[i]
    local done
    if t.kind == 'q' then
      if refund then done = quota_undo(t, keys[ki], id, now) end
    elseif t.kind == 'b' then
      done = bucket_undo(t, keys[ki], keys[ki + 2], id, now, refund)
      -- A booking not yet claimed: its slot is given back.
      local member = ticket_member(id, t.cost)
      local s = tonum(rcall('ZSCORE', keys[ki + 1], member))
      if s then
        rcall('ZREM', keys[ki + 1], member)
        bucket_give(keys[ki], keys[ki + 2], s, bucket_len(t), now)
        done = true
      end
    elseif t.kind == 'c' then
      if refund then done = cal_undo(t, keys[ki], id, now) end
    end
    ki = ki + t.nk
    if done then undone = undone + 1 end
  end
  return {now, undone}
end

local function release(keys, args) return undo_task(keys, args, true) end
local function forget(keys, args) return undo_task(keys, args, false) end
