-- Create one request, or every request of one round of a run, in a single step.
-- ARGV: prefix, now, maxlen, run_id ('' for none), round, then per request:
--       id, queue, expires_at, fields (JSON object of string values).
-- Returns {'ok'}, or {'exists'} when this run's round was already registered (a retried job).
local prefix, now, maxlen, run_id, round = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local round_key
if run_id ~= '' then
  round_key = prefix .. 'run:' .. run_id .. ':round:' .. round
  if redis.call('EXISTS', round_key) == 1 then return {'exists'} end
end
for i = 6, #ARGV, 4 do
  local id, queue, expires_at = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local key = prefix .. 'req:' .. id
  if redis.call('EXISTS', key) == 1 then return {'duplicate', id} end
  local fields = cjson.decode(ARGV[i + 3])
  local flat = {}
  for k, v in pairs(fields) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  redis.call('HSET', key, unpack(flat))
  redis.call('ZADD', prefix .. 'expiry', expires_at, id)
  redis.call('ZADD', prefix .. 'requests', now, id)
  redis.call('XADD', prefix .. 'stream:' .. queue, 'MAXLEN', '~', maxlen, '*',
    'type', 'approval.requested', 'request_id', id, 'queue', queue)
  if round_key then
    redis.call('RPUSH', round_key, id)
    redis.call('SADD', prefix .. 'run:' .. run_id .. ':pending', id)
  end
end
if round_key then
  redis.call('HSET', prefix .. 'run:' .. run_id, 'status', 'waiting', 'round', round, 'updated_at', now)
end
return {'ok'}
