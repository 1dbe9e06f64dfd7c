-- The first step of a sweep: forget index entries past the retention, and list what is due.
-- KEYS by role: expiry, requests. A: limit, retention, now (optional: else Redis's clock).
-- Returns the ids whose expiry is due, soonest first, at most `limit`; sweep.lua handles them.
local now, limit = clock(), tonumber(A.limit)
-- Forget index entries whose last change is older than the retention (their hashes have
-- expired); a request still pending that long is kept, its entry moved to now.
local stale = redis.call('ZRANGEBYSCORE', key('requests'), '-inf', stamp(now - A.retention),
  'LIMIT', 0, limit)
for _, id in ipairs(stale) do
  if redis.call('ZSCORE', key('expiry'), id) then
    redis.call('ZADD', key('requests'), stamp(now), id)
  else
    redis.call('ZREM', key('requests'), id)
  end
end
return redis.call('ZRANGEBYSCORE', key('expiry'), '-inf', stamp(now), 'LIMIT', 0, limit)
