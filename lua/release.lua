-- release.lua (after rules.lua): gives back what a task's admission took.
--
-- KEYS and ARGV as described in rules.lua (ARGV[2] and ARGV[3] are unused).
-- Only takes that hold this task ID are undone, so releasing twice, or
-- releasing a task that was never admitted, changes nothing. A bucket gets its
-- tokens back (never above burst); a fixed window only while it is still the
-- window the task was counted in.
--
-- Returns {takes undone, now_us}.

local id = ARGV[1]
local now = now_us()
local undone = 0
for _, t in ipairs(parse()) do
  local done
  if t.kind == 'q' then
    done = quota_undo(t, id, now)
  elseif t.kind == 'b' then
    done = bucket_undo(t, id, now)
  else
    done = fixed_undo(t, id, now)
  end
  if done then undone = undone + 1 end
end
return {undone, now}
