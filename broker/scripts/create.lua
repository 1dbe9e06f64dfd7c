-- Create one request, or every request of one round of a run, in a single step.
-- KEYS by role: expiry, requests, counts, each request's hash (key_of(id, 'req')), the streams of their
--   queues; for a run also run (its hash), round (its list of this round) and pending.
-- A: maxlen, round, requests = [{id, timeout_s, fields = {name = value}}]; created_at and
--   expires_at are set here, on Redis's clock.
-- Returns {'ok', created_at, expires_at of each request...}, {'exists'} when this run's round
-- was already registered (a retried job), or {'duplicate', id} when an id is taken (nothing is
-- written then).
local round_key = key('round')
if round_key and redis.call('EXISTS', round_key) == 1 then return {'exists'} end
for _, r in ipairs(A.requests) do
  if redis.call('EXISTS', key_of(r.id, 'req')) == 1 then return {'duplicate', r.id} end
end
local now = clock()
local created = stamp(now)
local out = {'ok', created}
for _, r in ipairs(A.requests) do
  local expires = stamp(now + tonumber(r.timeout_s))
  local queue = r.fields.queue
  local flat = {'id', r.id, 'created_at', created, 'expires_at', expires}
  for name, value in pairs(r.fields) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  redis.call('HSET', key_of(r.id, 'req'), unpack(flat))
  redis.call('ZADD', key('expiry'), expires, r.id)
  redis.call('ZADD', key('requests'), created, r.id)
  index_created(r.id, queue, expires, created, now)
  count('pending:' .. queue, 1)
  emit(queue, 'type', 'approval.requested', 'request_id', r.id, 'queue', queue)
  if round_key then
    redis.call('RPUSH', round_key, r.id)
    redis.call('SADD', key('pending'), r.id)
  end
  out[#out + 1] = expires
end
if round_key then
  redis.call('HSET', key('run'), 'status', 'waiting', 'round', A.round, 'updated_at', created)
end
return out
