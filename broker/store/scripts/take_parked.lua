-- Take up to ARGV[3] parked deliveries that are due (score <= ARGV[1]) and lease them to the
-- caller until ARGV[2]; a schedule entry whose data is gone is dropped.
-- KEYS: schedule ZSET, data HASH. Returns a flat list: id, data, id, data, ...
-- Run by `broker.store.parked`.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(due) do
  local data = redis.call('HGET', KEYS[2], id)
  if data then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    out[#out + 1] = id
    out[#out + 1] = data
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
