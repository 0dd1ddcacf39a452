-- release.lua (after rules.lua): gives back what tasks' admissions took.
--
--   args  -> per task: its ID and its plan (see rules.lua; the max wait is
--            not used)
--   keys  -> the takes' keys, task after task, in take order
--
-- Only takes that hold the task ID are undone, so releasing twice, or
-- releasing a task that was never admitted, changes nothing; nor does an
-- entry that no longer counts (a quota entry out of every window, a ledger
-- entry older than remember). A bucket gets its tokens back (never above
-- burst); a fixed window only while it is still the window the task was
-- counted in.
--
-- A bucket refunds the cost only if nothing took its tokens at a moment
-- later than the released one's (see bucket_undo); otherwise the ledger
-- entry goes, its ledger's tombstone records the take, and the tokens come
-- back with time.
--
-- Either also drops a booking the task holds on a bucket (see book.lua).
--
-- forget is release for a send the provider took (a 429 or 5xx answer): the
-- tasks' bucket ledger entries are removed without any refund (the
-- tombstone records them), so that a retry takes a token again rather than
-- passing as already held. Quotas and
-- fixed windows are left as they are.
--
-- Both return {now_us, takes undone of task 1, of task 2, ...}.

-- undo_tasks undoes the takes of the tasks in args; with refund false only
-- bucket ledger entries are removed, with no token given back (forget).
local function undo_tasks(keys, args, refund)
  if not rcall then bind() end
  memo = false
  local now = now_us()
  local out, ki = {now}, 1
  for j = 1, #args, 2 do
    local id, p = args[j], plan(args[j + 1])
    local remember = p.remember
    local undone = 0
    for i = 1, p.n do
      local t = p[i]
      local done
      if t.kind == 'q' then
        if refund then done = quota_undo(t, keys[ki], id, now) end
      elseif t.kind == 'b' then
        done = bucket_undo(t, keys[ki], keys[ki + 1], id, now, remember, refund)
        -- A booking not yet claimed: its slot is given up (see book.lua).
        if rcall('ZREM', keys[ki + 2], id) == 1 then done = true end
      elseif t.kind == 'f' then
        if refund then done = fixed_undo(t, keys[ki], id, now) end
      elseif t.kind == 'c' then
        if refund then done = cal_undo(t, keys[ki], id, now) end
      end
      ki = ki + t.nk
      if done then undone = undone + 1 end
    end
    out[#out + 1] = undone
  end
  return out
end

local function release(keys, args) return undo_tasks(keys, args, true) end
local function forget(keys, args) return undo_tasks(keys, args, false) end
