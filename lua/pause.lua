-- pause.lua (after rules.lua): pauses a token bucket for every caller, for a
-- provider that answered "429 Too Many Requests, Retry-After: d".
--
--   args  -> the pause in µs, then a plan (see rules.lua) of one bucket take
--   keys  -> the bucket's keys
--
-- The bucket is drained so that its next token is due when the pause ends:
-- tokens become min(tokens, 1 - rate * pause). Every admission then waits
-- exactly as the bucket says, with no extra key to check on the hot path.
-- Tokens already reserved are not taken back. The ledger's tombstone is
-- raised to the pause's end, so that no release refunds a token the pause
-- drained (see bucket_undo).
--
-- Returns {µs until the bucket's next token}.

local function pause(keys, args)
  if not rcall then bind() end
  memo = false
  local us = tonum(args[1])
  local now = now_us()
  local p = plan(args[2])
  local t = p[1]
  if p.n ~= 1 or t.kind ~= 'b' then
    return redis.error_reply('throttle: pause needs one bucket take')
  end
  local tokens, _, v = bucket_tokens(t, keys[1], keys[2], now)
  tokens = min(tokens, 1 - t.rate * us / 1e6)
  bucket_store(t, keys[1], now, tokens, nil, v)
  tomb(keys[2], now + us, now, p.remember)
  return {ceil((1 - tokens) * 1e6 / t.rate)}
end
