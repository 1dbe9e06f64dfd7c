-- Create one request, or every request of one round of a run, in a single step.
-- ARGV: prefix, now, maxlen, run_id ('' for none), round, then the 18 field names
--       (the first is id, then ... queue at 12, expires_at at 16), then one JSON array of the
--       18 values per request (one argument each: far cheaper to send than 18).
-- Returns {'ok'}, {'exists'} when this run's round was already registered (a retried job),
-- or {'duplicate', id} when a request id is taken (nothing is written then).
local prefix, now, maxlen, run_id, round = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local NAMES, N = 6, 18
local FIRST = NAMES + N
local requests = {}
for i = FIRST, #ARGV do requests[#requests + 1] = cjson.decode(ARGV[i]) end
local round_key
if run_id ~= '' then
  round_key = prefix .. 'run:' .. run_id .. ':round:' .. round
  if redis.call('EXISTS', round_key) == 1 then return {'exists'} end
end
for _, values in ipairs(requests) do
  if redis.call('EXISTS', prefix .. 'req:' .. values[1]) == 1 then return {'duplicate', values[1]} end
end
for _, values in ipairs(requests) do
  local id, queue, expires_at = values[1], values[12], values[16]
  local flat = {}
  for j = 1, N do
    flat[#flat + 1] = ARGV[NAMES + j - 1]
    flat[#flat + 1] = values[j]
  end
  redis.call('HSET', prefix .. 'req:' .. id, unpack(flat))
  redis.call('ZADD', prefix .. 'expiry', expires_at, id)
  redis.call('ZADD', prefix .. 'requests', now, id)
  redis.call('HINCRBY', prefix .. 'counts', 'pending:' .. queue, 1)
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
