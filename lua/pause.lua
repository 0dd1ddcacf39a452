-- pause.lua (after rules.lua): pauses a token bucket for every caller, for a
-- provider that answered "429 Too Many Requests, Retry-After: d".
--
-- KEYS and ARGV as described in rules.lua, with exactly one bucket take;
-- ARGV[2] is the pause in µs.
--
-- The bucket is drained so that its next token is due when the pause ends:
-- tokens become min(tokens, 1 - rate * pause). Every admission then waits
-- exactly as the bucket says, with no extra key to check on the hot path.
-- Tokens already reserved are not taken back.
--
-- Returns the µs until the bucket's next token.

local pause = tonumber(ARGV[2])
local now = now_us()
local t = parse()[1]
if t.kind ~= 'b' then
  return redis.error_reply('throttle: pause needs a bucket take')
end
local tokens = math.min(bucket_tokens(t, now), 1 - t.rate * pause / 1e6)
bucket_store(t, now, tokens)
return math.ceil((1 - tokens) * 1e6 / t.rate)
