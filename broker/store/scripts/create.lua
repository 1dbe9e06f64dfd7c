-- Create standalone requests of one partition, or every request of one round of a run, in a
-- single step: each request's hash, its expiry and listing entries, the counts and its event.
-- KEYS by role: expiry, requests, counts, resumes, the shared and per-queue listing indexes,
--   the streams of the queues; 'creator:NAME' (the index of each creator); on a single Redis
--   rule_version, rule_hits and 'rule:ID' (the hash of each rule chosen to decide one); for a
--   run also run, round, pending, run_requests and run_events. Then the request hashes, in the order of
--   the requests, from KEYS[A.req_at].
-- A (ARGV[1]): maxlen, round, run_id, run_events_maxlen (a round), retention, audit_keep (absent: no audit entries); version: the rules' version the caller matched
--   with ('' for none; absent: not checked here, as on a cluster); rules = {[position] = {id,
--   effect, status, decision (JSON text), entry (JSON text), cell}} for requests a rule decides;
--   routes = {[position] = {id, entry (JSON text), cell}} for requests a routing rule placed
--   (their queue, quorum and timeout are already in their fields and variant); tally = the
--   created counts for the insights rollups (lib.lua's rollup); ins_keep;
--   v = the batch's variants, a list of {timeout_s, queue, creator ('' for none)}; copy = 1:
--   a request of a shape already written is made by COPY (below).
-- The hash fields are sent column-wise (`broker.store.request_hash.encode` made them, never decoded
-- here): ARGV[2] = t, then t values (name, value pairs) every request of the call shares; then
-- s, the shapes: each a variant (1-based index into A.v), n, and the n names of the fields its
-- requests have of their own; then per request, in KEYS' order, its shape (only when s > 1)
-- and the values of its shape's n fields. A request's id is its key past A.cut bytes.
-- created_at, expires_at, decided_at and the history entry's `at` are set here, on Redis's clock.
-- A request with a rule is written already decided: it never waits, is announced only as
-- `approval.decided` (marked `ruled_at_create`, so no person is asked), and counts a hit on the
-- rule (here on a single Redis; on a cluster the caller counts it in the rules' own slot).
-- When every call of a round is so decided, the resume goes to the outbox in this step.
-- Returns {'ok', created_at, decided_at (ISO text, when a rule decided one; else ''), expires_at of
-- each variant...} ('ok_whole' for 'ok' when COPY was refused), {'exists'} when this run's round
-- was already registered (a retried job), {'duplicate', id} when an id is taken,
-- {'rules_changed', version} when the rules changed since the caller matched, or
-- {'rule_changed', rule_id} when a chosen rule was revoked, expired or removed meanwhile
-- (nothing is written then; the caller matches again).
local round_key = key('round')
if round_key and redis.call('EXISTS', round_key) == 1 then return {'exists'} end
local shared_n = tonumber(ARGV[2])
local pos = 3 + shared_n
local shape_args = {}
for si = 1, tonumber(ARGV[pos]) do
  local n = tonumber(ARGV[pos + 2])
  shape_args[si] = {variant = tonumber(ARGV[pos + 1]), n = n, names = pos + 3}
  pos = pos + 2 + n
end
local first = pos + 1  -- where the first request's values are
local req_at, cut = A.req_at, A.cut
for j = req_at, #KEYS, 4000 do  -- one EXISTS for many; the taken one is looked for only then
  if redis.call('EXISTS', unpack(KEYS, j, math.min(j + 3999, #KEYS))) > 0 then
    for k = req_at, #KEYS do
      if redis.call('EXISTS', KEYS[k]) == 1 then
        return {'duplicate', string.sub(KEYS[k], cut + 1)}
      end
    end
  end
end
local version_key = key('rule_version')
if version_key and A.version then
  local v = redis.call('GET', version_key) or ''
  if v ~= A.version then return {'rules_changed', v} end
end
local now = clock()
local rules = A.rules or {}
local routes = A.routes or {}
if version_key then
  for _, chosen in ipairs({rules, routes}) do
    for _, rule in pairs(chosen) do
      local f = redis.call('HMGET', key('rule:' .. rule.id), 'id', 'revoked_at', 'expires_at')
      if (not f[1]) or f[2] or (f[3] and tonumber(f[3]) <= now) then
        return {'rule_changed', rule.id}
      end
    end
  end
end
local function rule_hit(rule_id, effect, created)
  if not version_key then return end  -- on a cluster the caller counts it in the rules' slot
  local rule_key = key('rule:' .. rule_id)
  redis.call('HINCRBY', rule_key, 'hits', 1)
  redis.call('HSET', rule_key, 'last_hit_at', created)
  redis.call('HINCRBY', key('rule_hits'), effect .. ':' .. rule_id, 1)
end

-- Index entries are gathered and written with one ZADD per index, old entries forgotten once.
local adds, aged = {}, {}
local function entries(zkey, ages)  -- the {score, id, ...} list of one index
  local t = adds[zkey]
  if not t then t = {}; adds[zkey] = t end
  if ages then aged[zkey] = true end  -- a listing index: entries past the retention leave
  return t
end
local counted = {}
local function tally(field, n)
  counted[field] = (counted[field] or 0) + n
end

local created = stamp(now)
local any_rule = next(rules) ~= nil
local any_route = next(routes) ~= nil
local out = {'ok', created, any_rule and iso(now) or ''}
local run_requests = key('run_requests')
local of_run = run_requests and entries(run_requests)
local listed, expiring = entries(key('requests')), entries(key('expiry'))
-- One HSET command per shape (a variant: timeout, queue, creator; and the names of its
-- requests' own fields), reused for every request of it: key, id and own values set in place.
local variants = {}
for vi, v in ipairs(A.v) do
  local expires = stamp(now + tonumber(v[1]))
  local queue, creator = v[2], v[3]
  local cmd = {'HSET', false, 'id', false, 'created_at', created, 'expires_at', expires}
  if creator ~= '' then
    cmd[#cmd + 1] = 'created_by'
    cmd[#cmd + 1] = creator
  end
  for j = 3, 2 + shared_n do cmd[#cmd + 1] = ARGV[j] end
  variants[vi] = {cmd = cmd, expires = expires, queue = queue, waiting = 0, creator = creator,
    by_creator = creator ~= '' and entries(key('creator:' .. creator), true) or nil,
    in_queue = entries(key('queue:' .. queue), true),
    pending = entries(key('pending:' .. queue)), stream = stream_of(queue)}
  out[#out + 1] = expires
end
local shapes = {}
for si, sh in ipairs(shape_args) do
  local q = variants[sh.variant]
  local cmd = {unpack(q.cmd)}
  local base = #cmd
  local own = {'HSET', false, 'id', false}  -- a copy's command: its id and own values
  for j = 0, sh.n - 1 do
    local name = ARGV[sh.names + j]
    cmd[base + 2 * j + 1], cmd[base + 2 * j + 2] = name, false
    own[5 + 2 * j], own[6 + 2 * j] = name, false
  end
  shapes[si] = {q = q, cmd = cmd, base = base, n = sh.n, own = own}
end
-- A request of a shape already written (and not decided by a rule) is a COPY of that hash with
-- its id and own values set: Redis duplicates the hash's encoding in one go instead of building
-- it field by field, and the AOF gets two short commands instead of the whole field list. When
-- COPY is refused (an ACL without +copy), every request of the call is written whole instead and
-- the reply says so ('ok_whole'), so the caller stops asking.
local copying = A.copy == 1
local agent  -- the run's, read once for the audit entries
local one = #shapes == 1 and shapes[1]
pos = first
local i, ni, nx = 0, 0, 0  -- ni: entries in `listed`, nx: in `expiring`
for r = req_at, #KEYS do
  i = i + 1
  local s = one
  if not s then
    s = shapes[tonumber(ARGV[pos])]
    pos = pos + 1
  end
  local rkey = KEYS[r]
  local id = string.sub(rkey, cut + 1)
  local q = s.q
  local rule = any_rule and rules[tostring(i)]
  local route = any_route and routes[tostring(i)]
  local copied = false
  if copying and s.src then
    local done = redis.pcall('COPY', s.src, rkey)
    if done == 1 then
      local own = s.own
      own[2], own[4] = rkey, id
      for j = 1, s.n do
        own[4 + 2 * j] = ARGV[pos]
        pos = pos + 1
      end
      redis.call(unpack(own))
      copied = true
    else
      copying = false
      out[1] = 'ok_whole'
    end
  end
  if not copied then
    local cmd, base = s.cmd, s.base
    cmd[2], cmd[4] = rkey, id
    for j = 1, s.n do
      cmd[base + 2 * j] = ARGV[pos]
      pos = pos + 1
    end
    redis.call(unpack(cmd))
    if not (rule or route) then s.src = rkey end  -- a pristine hash: the next ones copy it
  end
  local queue, expires = q.queue, q.expires
  listed[ni + 1] = created; listed[ni + 2] = id; ni = ni + 2
  local t = q.in_queue
  local k = #t
  t[k + 1] = created; t[k + 2] = id
  if q.by_creator then
    t = q.by_creator
    k = #t
    t[k + 1] = created; t[k + 2] = id
  end
  if of_run then
    k = #of_run
    of_run[k + 1] = created; of_run[k + 2] = id
    redis.call('RPUSH', round_key, id)
  end
  if A.audit_keep then  -- created by a principal (a person), or by a run's agent (the system)
    local g = redis.call('HMGET', rkey, 'args_hash', 'tool_name', 'kind')
    local creator = q.creator
    if creator == '' and not agent then
      agent = round_key and ('agent:' .. (redis.call('HGET', key('run'), 'agent') or '')) or ''
    end
    audit(now, id, 'created', creator ~= '' and creator or agent,
      creator ~= '' and 'person' or 'system', '', g[1] or '',
      cjson.encode({tool = g[2] or '', queue = queue, kind = g[3] or ''}))
    if rule then
      audit(now, id, 'decided', 'rule:' .. rule.id, 'rule', rule.status, g[1] or '', '')
    end
  end
  if route then  -- where a routing rule placed it: recorded, and the rule's hit counted
    append_history(rkey, with_fields(route.entry, {{'at', iso(now)}}))
    rule_hit(route.id, 'route', created)
    rollup(now, 'r' .. US .. ins_cell(route.cell[1], route.cell[2], route.cell[3]) .. US
      .. route.id, 1)
  end
  if rule then
    local at = {{'decided_at', iso(now)}}
    redis.call('HSET', rkey, 'status', rule.status, 'decision', with_fields(rule.decision, at))
    append_history(rkey, with_fields(rule.entry, {{'at', iso(now)}}))
    redis.call('EXPIRE', rkey, A.retention)
    rule_hit(rule.id, rule.effect, created)
    ins_outcome(now, ins_cell(rule.cell[1], rule.cell[2], rule.cell[3]), rule.status,
      'rule:' .. rule.id, ins_text(cjson.decode(rule.decision).reason), nil)
    for _, role in ipairs({'done:' .. rule.status, 'done:' .. rule.status .. ':' .. queue}) do
      t = entries(key(role), true)
      k = #t
      t[k + 1] = created; t[k + 2] = id
    end
    tally(rule.status .. ':' .. queue, 1)
    emit(queue, 'type', 'approval.decided', 'request_id', id, 'queue', queue,
      'ruled_at_create', '1')
  else
    expiring[nx + 1] = expires; expiring[nx + 2] = id; nx = nx + 2
    t = q.pending
    k = #t
    t[k + 1] = expires; t[k + 2] = id
    q.waiting = q.waiting + 1
    redis.call('XADD', q.stream, 'MAXLEN', '~', A.maxlen, '*', 'type', 'approval.requested',
      'request_id', id, 'queue', queue)  -- as emit() does (not one XTRIM per step: the
      -- documented ACL has no XTRIM, and the saving was a percent of Redis's time)
    if round_key then redis.call('SADD', key('pending'), id) end
  end
end
for _, q in ipairs(variants) do
  if q.waiting > 0 then tally('pending:' .. q.queue, q.waiting) end
end
for zkey, t in pairs(adds) do
  for j = 1, #t, 4000 do  -- an index no request of this call entered has none: skipped
    redis.call('ZADD', zkey, unpack(t, j, math.min(j + 3999, #t)))
  end
  if aged[zkey] then forget_old(zkey, now) end
end
for field, n in pairs(counted) do count(field, n) end
for _, row in ipairs(A.tally or {}) do  -- created: queue, roles, creator, agent, tool, n
  rollup(now, 'n' .. US .. ins_cell(row[1], row[2], row[3]) .. US .. row[4] .. US .. row[5],
    row[6])
end
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
    -- the pause, announced to the run's long-polls in the step that makes it (`RunStore.announce`)
    redis.call('XADD', key('run_events'), 'MAXLEN', '~', A.run_events_maxlen, '*',
      'run_id', A.run_id, 'status', 'waiting')
  end
end
return out
