-- release.lua: give up a fan-out's lease, if it is still this run's, so
-- that another worker may resume the fan-out at once.
--
-- KEYS[1] -> the tick's lease
-- ARGV[1] -> this run's lease token
--
-- Returns 1 when released, 0 when the lease was not this run's.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
