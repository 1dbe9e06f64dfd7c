-- Create one request, or every request of one round of a run, in a single step.
-- KEYS by role: expiry, requests, counts, resumes, rule_hits (when a rule decides), each request's hash (key_of(id, 'req')) and,
--   for one a policy rule decides, that rule's hash (key_of(id, 'rule')), the streams of their
--   queues; for a run also run (its hash), round (its list of this round) and pending.
-- A: maxlen, round, run_id, retention, requests = [{id, timeout_s, fields = {name = value},
--   rule = {id, effect, status, decision (JSON text), entry (JSON text)} or absent}]; created_at,
--   expires_at, decided_at and the history entry's `at` are set here, on Redis's clock.
-- A request with a rule is written already decided: it never waits, is announced only as
-- `approval.decided` (marked `ruled_at_create`, so no person is asked), and counts a hit on the
-- rule. When every call of a round is so decided, the resume goes to the outbox in this step.
-- Returns {'ok', created_at, expires_at of each request...}, {'exists'} when this run's round
-- was already registered (a retried job), {'duplicate', id} when an id is taken, or
-- {'rule_changed', rule_id} when a chosen rule was revoked, expired or removed meanwhile
-- (nothing is written then; the caller matches again).
local round_key = key('round')
if round_key and redis.call('EXISTS', round_key) == 1 then return {'exists'} end
for _, r in ipairs(A.requests) do
  if redis.call('EXISTS', key_of(r.id, 'req')) == 1 then return {'duplicate', r.id} end
end
local now = clock()
for _, r in ipairs(A.requests) do
  if r.rule then
    local f = redis.call('HMGET', key_of(r.id, 'rule'), 'id', 'revoked_at', 'expires_at')
    if (not f[1]) or f[2] or (f[3] and tonumber(f[3]) <= now) then
      return {'rule_changed', r.rule.id}
    end
  end
end
local created = stamp(now)
local out = {'ok', created}
for _, r in ipairs(A.requests) do
  local rkey = key_of(r.id, 'req')
  local expires = stamp(now + tonumber(r.timeout_s))
  local queue = r.fields.queue
  local flat = {'id', r.id, 'created_at', created, 'expires_at', expires}
  for name, value in pairs(r.fields) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  redis.call('HSET', rkey, unpack(flat))
  redis.call('ZADD', key('requests'), created, r.id)
  if round_key then redis.call('RPUSH', round_key, r.id) end
  index_created(r.id, queue, expires, created, now)
  if r.rule then
    local at = {{'decided_at', iso(now)}}
    redis.call('HSET', rkey, 'status', r.rule.status, 'decision', with_fields(r.rule.decision, at))
    append_history(rkey, with_fields(r.rule.entry, {{'at', iso(now)}}))
    redis.call('EXPIRE', rkey, A.retention)
    local rule_key = key_of(r.id, 'rule')
    redis.call('HINCRBY', rule_key, 'hits', 1)
    redis.call('HSET', rule_key, 'last_hit_at', created)
    redis.call('HINCRBY', key('rule_hits'), r.rule.effect .. ':' .. r.rule.id, 1)
    index_finished(r.id, queue, r.rule.status, now, round_key and {pending = key('pending')} or nil)
    count(r.rule.status .. ':' .. queue, 1)
    emit(queue, 'type', 'approval.decided', 'request_id', r.id, 'queue', queue,
      'ruled_at_create', '1')
  else
    redis.call('ZADD', key('expiry'), expires, r.id)
    count('pending:' .. queue, 1)
    emit(queue, 'type', 'approval.requested', 'request_id', r.id, 'queue', queue)
    if round_key then redis.call('SADD', key('pending'), r.id) end
  end
  out[#out + 1] = expires
end
if round_key then
  if redis.call('SCARD', key('pending')) == 0 then
    -- every call of the round was decided by a rule: resume now, exactly once
    redis.call('XADD', key('resumes'), '*', 'run_id', A.run_id, 'round', A.round)
    redis.call('HSET', key('run'), 'status', 'queued', 'round', A.round, 'updated_at', created)
  else
    redis.call('HSET', key('run'), 'status', 'waiting', 'round', A.round, 'updated_at', created)
  end
end
return out
