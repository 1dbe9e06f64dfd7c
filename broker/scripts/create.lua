-- Create standalone requests of one partition, or every request of one round of a run, in a
-- single step: each request's hash, its expiry and listing entries, the counts and its event.
-- KEYS by role: expiry, requests, counts, resumes, the shared and per-queue listing indexes,
--   the streams of the queues; 'creator:NAME' (the index of each creator); on a single Redis
--   rule_version, rule_hits and 'rule:ID' (the hash of each rule chosen to decide one); for a
--   run also run, round, pending and run_requests. Then the request hashes, in the order of
--   the requests, from KEYS[A.req_at].
-- A (ARGV[1]): maxlen, round, run_id, retention; version: the rules' version the caller matched
--   with ('' for none; absent: not checked here, as on a cluster); rules = {[position] = {id,
--   effect, status, decision (JSON text), entry (JSON text)}} for requests a rule decides.
-- ARGV[2...]: per request: id, timeout_s, creator ('' for none), queue, n, then n values (the
--   hash's name, value pairs as `broker.request_hash.encode` made them, never decoded here).
-- created_at, expires_at, decided_at and the history entry's `at` are set here, on Redis's clock.
-- A request with a rule is written already decided: it never waits, is announced only as
-- `approval.decided` (marked `ruled_at_create`, so no person is asked), and counts a hit on the
-- rule (here on a single Redis; on a cluster the caller counts it in the rules' own slot).
-- When every call of a round is so decided, the resume goes to the outbox in this step.
-- Returns {'ok', created_at, decided_at (ISO text, when a rule decided one; else ''), expires_at of
-- each request...}, {'exists'} when this run's round
-- was already registered (a retried job), {'duplicate', id} when an id is taken,
-- {'rules_changed', version} when the rules changed since the caller matched, or
-- {'rule_changed', rule_id} when a chosen rule was revoked, expired or removed meanwhile
-- (nothing is written then; the caller matches again).
local round_key = key('round')
if round_key and redis.call('EXISTS', round_key) == 1 then return {'exists'} end
local reqs, pos = {}, 2
while pos <= #ARGV do
  local n = tonumber(ARGV[pos + 4])
  reqs[#reqs + 1] = {id = ARGV[pos], timeout = tonumber(ARGV[pos + 1]), creator = ARGV[pos + 2],
    queue = ARGV[pos + 3], from = pos + 5, to = pos + 4 + n, key = KEYS[A.req_at + #reqs]}
  pos = pos + 5 + n
end
for _, r in ipairs(reqs) do
  if redis.call('EXISTS', r.key) == 1 then return {'duplicate', r.id} end
end
local version_key = key('rule_version')
if version_key and A.version then
  local v = redis.call('GET', version_key) or ''
  if v ~= A.version then return {'rules_changed', v} end
end
local now = clock()
local rules = A.rules or {}
if version_key then
  for i, _ in ipairs(reqs) do
    local rule = rules[tostring(i)]
    if rule then
      local f = redis.call('HMGET', key('rule:' .. rule.id), 'id', 'revoked_at', 'expires_at')
      if (not f[1]) or f[2] or (f[3] and tonumber(f[3]) <= now) then
        return {'rule_changed', rule.id}
      end
    end
  end
end

-- Index entries are gathered and written with one ZADD per index, old entries forgotten once.
local adds, aged = {}, {}
local function add(zkey, score, id, ages)
  local t = adds[zkey]
  if not t then t = {}; adds[zkey] = t end
  if ages then aged[zkey] = true end  -- a listing index: entries past the retention leave
  t[#t + 1] = score
  t[#t + 1] = id
end
local counted = {}
local function tally(field)
  counted[field] = (counted[field] or 0) + 1
end

local created = stamp(now)
local any_rule = next(rules) ~= nil
local out = {'ok', created, any_rule and iso(now) or ''}
local run_requests = key('run_requests')
local requests_key, expiry_key = key('requests'), key('expiry')
local stamps, per_queue = {}, {}  -- by timeout, by queue: what every request there shares
for i, r in ipairs(reqs) do
  local expires = stamps[r.timeout]
  if not expires then
    expires = stamp(now + r.timeout)
    stamps[r.timeout] = expires
  end
  local queue = r.queue
  local q = per_queue[queue]
  if not q then
    q = {listed = key('queue:' .. queue), pending = key('pending:' .. queue),
      stream = stream_of(queue), waiting = 'pending:' .. queue}
    per_queue[queue] = q
  end
  if r.creator ~= '' then
    redis.call('HSET', r.key, 'id', r.id, 'created_at', created, 'expires_at', expires,
      'created_by', r.creator, unpack(ARGV, r.from, r.to))
    add(key('creator:' .. r.creator), created, r.id, true)
  else
    redis.call('HSET', r.key, 'id', r.id, 'created_at', created, 'expires_at', expires,
      unpack(ARGV, r.from, r.to))
  end
  add(requests_key, created, r.id)
  if round_key then redis.call('RPUSH', round_key, r.id) end
  if run_requests then add(run_requests, created, r.id) end
  add(q.listed, created, r.id, true)
  local rule = any_rule and rules[tostring(i)]
  if rule then
    local at = {{'decided_at', iso(now)}}
    redis.call('HSET', r.key, 'status', rule.status, 'decision', with_fields(rule.decision, at))
    append_history(r.key, with_fields(rule.entry, {{'at', iso(now)}}))
    redis.call('EXPIRE', r.key, A.retention)
    if version_key then
      local rule_key = key('rule:' .. rule.id)
      redis.call('HINCRBY', rule_key, 'hits', 1)
      redis.call('HSET', rule_key, 'last_hit_at', created)
      redis.call('HINCRBY', key('rule_hits'), rule.effect .. ':' .. rule.id, 1)
    end
    for _, role in ipairs({'done:' .. rule.status, 'done:' .. rule.status .. ':' .. queue}) do
      add(key(role), created, r.id, true)
    end
    tally(rule.status .. ':' .. queue)
    emit(queue, 'type', 'approval.decided', 'request_id', r.id, 'queue', queue,
      'ruled_at_create', '1')
  else
    add(expiry_key, expires, r.id)
    add(q.pending, expires, r.id)
    tally(q.waiting)
    redis.call('XADD', q.stream, 'MAXLEN', '~', A.maxlen, '*', 'type', 'approval.requested',
      'request_id', r.id, 'queue', queue)  -- as emit() does
    if round_key then redis.call('SADD', key('pending'), r.id) end
  end
  out[#out + 1] = expires
end
for zkey, t in pairs(adds) do
  for j = 1, #t, 4000 do
    redis.call('ZADD', zkey, unpack(t, j, math.min(j + 3999, #t)))
  end
  if aged[zkey] then forget_old(zkey, now) end
end
for field, n in pairs(counted) do count(field, n) end
if round_key then
  redis.call('PERSIST', run_requests)
  if redis.call('SCARD', key('pending')) == 0 then
    -- every call of the round was decided by a rule: resume now, exactly once; the run's
    -- index is forgotten with its last decided request, unless a new round comes
    redis.call('EXPIRE', run_requests, A.retention)
    redis.call('XADD', key('resumes'), '*', 'run_id', A.run_id, 'round', A.round)
    redis.call('HSET', key('run'), 'status', 'queued', 'round', A.round, 'updated_at', created)
  else
    redis.call('HSET', key('run'), 'status', 'waiting', 'round', A.round, 'updated_at', created)
  end
end
return out
