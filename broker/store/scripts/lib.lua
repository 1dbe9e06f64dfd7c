-- Shared helpers, prepended to every script.
-- ARGV[1] is the call's one JSON argument. Its `k` maps role names to positions in KEYS, its
-- `streams` maps queue names to their stream's position, and its `r` maps a request id to its
-- keys' roles and positions (broker/store/script_keys.py, ScriptKeys): scripts find every key with key(role),
-- stream_of(queue) or key_of(id, role) and never build a key name.
local A = cjson.decode(ARGV[1])

local function key(role)
  local i = A.k[role]
  return i and KEYS[i]
end

local function key_of(id, role)
  local roles = A.r[id]
  local i = roles and roles[role]
  return i and KEYS[i]
end

local function stream_of(queue)
  local i = A.streams[queue]
  return i and KEYS[i]
end

-- The one clock is Redis's (TIME): a caller whose clock is off can't expire anything early or
-- late. An explicit `now` in the argument wins (tests that simulate the future).
local function clock()
  if A.now then return tonumber(A.now) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Epoch seconds as stored in hashes and used as scores: fixed six decimals.
local function stamp(t) return string.format('%.6f', t) end

-- Put string fields first in a JSON object's text without decoding it: cjson would not give
-- the rest back byte for byte (numbers, empty arrays). `pairs` is a list of {name, value}.
local function with_fields(json_obj, pairs_list)
  local parts = {}
  for _, p in ipairs(pairs_list) do parts[#parts + 1] = cjson.encode(p[1]) .. ':' .. cjson.encode(p[2]) end
  local rest = string.sub(json_obj, 2)
  if rest ~= '}' then rest = ',' .. rest end
  return '{' .. table.concat(parts, ',') .. rest
end

-- Append one JSON object to the request's JSON `history` array.
local function append_history(rkey, entry_json)
  local h = redis.call('HGET', rkey, 'history')
  if (not h) or h == '' or h == '[]' then
    h = '[' .. entry_json .. ']'
  else
    h = string.sub(h, 1, -2) .. ',' .. entry_json .. ']'
  end
  redis.call('HSET', rkey, 'history', h)
end

-- Fleet-wide gauges and counters for /metrics: `pending:QUEUE` and `STATUS:QUEUE`.
local function count(field, by)
  redis.call('HINCRBY', key('counts'), field, by)
end

local function emit(queue, ...)
  redis.call('XADD', stream_of(queue), 'MAXLEN', '~', A.maxlen, '*', ...)
end

-- The reply of a step on one request: a code, a detail, then the request's fields as stored
-- (HGETALL), so the caller needs no read before or after.
local function reply(rkey, code, detail)
  local out = {code, detail or ''}
  for _, v in ipairs(redis.call('HGETALL', rkey)) do out[#out + 1] = v end
  return out
end

-- What this call lacks to change a request waiting in `queue` (and moving to `to`) that belongs
-- to run `run_id` ('' for none), when the caller passed the keys of run `given_run`: nil when
-- nothing. The caller then calls again with that key; nothing was written.
local function lacking(queue, to, run_id, given_run)
  if not stream_of(queue) then return {'need_stream', queue} end
  if to and not stream_of(to) then return {'need_stream', to} end
  if run_id and run_id ~= '' and run_id ~= given_run then return {'need_run', run_id} end
  return nil
end

-- The listing indexes (broker/store/keys.py, `ix:*`), kept in the same steps as what they index.
-- Entries older than the retention leave on writes, at most 20 per write (their hashes have
-- expired; readers skip an id whose hash is gone); a still pending one is rescored to now,
-- as due.lua does for `requests`.
local function forget_old(zkey, now)
  if not (zkey and A.retention) then return end
  local stale = redis.call('ZRANGEBYSCORE', zkey, '-inf', stamp(now - A.retention), 'LIMIT', 0, 20)
  for _, id in ipairs(stale) do
    if redis.call('ZSCORE', key('expiry'), id) then
      redis.call('ZADD', zkey, stamp(now), id)
    else
      redis.call('ZREM', zkey, id)
    end
  end
end

local function index_finished(id, queue, status, now, run)
  redis.call('ZREM', key('pending:' .. queue), id)
  for _, role in ipairs({'done:' .. status, 'done:' .. status .. ':' .. queue, 'queue:' .. queue}) do
    local z = key(role)
    if z then
      redis.call('ZADD', z, stamp(now), id)
      forget_old(z, now)
    end
  end
  -- a run's index is forgotten with its last decided request, unless a new round comes
  local of_run = run and (run.requests or key('run_requests'))
  if of_run and run.pending and redis.call('SCARD', run.pending) == 0 then
    redis.call('EXPIRE', of_run, A.retention)
  end
end

local function index_moved(id, from, to, expires_at)
  redis.call('ZREM', key('pending:' .. from), id)
  redis.call('ZADD', key('pending:' .. to), expires_at, id)
  redis.call('ZREM', key('queue:' .. from), id)
  redis.call('ZADD', key('queue:' .. to), redis.call('ZSCORE', key('requests'), id) or expires_at, id)
end

-- Insights (docs/insights.md): the steps keep rollups of what happens, per UTC day (role
-- `ins:DAY`, DAY = days since the epoch) and per hour of it (`insh:DAY`, each field headed by
-- its hour `HH` and US), so `GET /v1/stats` reads a few hashes whatever the number of requests.
-- A field is a kind letter and its parts joined by US (\31), the cell first: queue,
-- allowed_roles as stored ('' for none), creator: what a reader's visibility is judged by
-- (broker/store/insights.py parses them). Kinds: n created (+ agent, tool), o outcome (+ status,
-- and who: person|rule|timeout), t time to a person's decision (+ histogram bound),
-- r rule hit (+ rule id), x reject reason, e escalation; p (no cell) answers per person.
local US = '\31'
local TTD_BOUNDS = {1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400,
  604800}
local REASONS_PER_DAY = 500  -- distinct reject reasons kept per day; the rest count as ''
local ins_at = nil

-- The day's two rollup hashes for Redis's clock `now`: its own day when the caller gave it,
-- else the nearest it gave (a caller clock more than an hour off; the hour is clamped).
local function ins_keys(now)
  if ins_at ~= nil then return ins_at end
  ins_at = false
  if not A.ins_keep then return false end
  local day = math.floor(now / 86400)
  local hour = math.floor((now % 86400) / 3600)
  if not key('ins:' .. day) then
    if key('ins:' .. (day - 1)) then day = day - 1; hour = 23
    elseif key('ins:' .. (day + 1)) then day = day + 1; hour = 0
    else return false end
  end
  ins_at = {day = key('ins:' .. day), hours = key('insh:' .. day),
    hour = string.format('%02d', hour)}
  return ins_at
end

local function rollup(now, field, n)
  local k = ins_keys(now)
  if not k then return end
  redis.call('HINCRBY', k.day, field, n)
  redis.call('HINCRBY', k.hours, k.hour .. US .. field, n)
  if not k.kept then
    k.kept = true
    redis.call('EXPIRE', k.day, A.ins_keep)
    redis.call('EXPIRE', k.hours, A.ins_keep)
  end
end

local function ins_cell(queue, roles, creator)
  return (queue or 'default') .. US .. (roles or '') .. US .. (creator or '')
end

local function ins_text(value)  -- a JSON string field, or nil (absent, null, another type)
  if type(value) == 'string' and value ~= '' then return value end
  return nil
end

local function ins_bound(waited)
  for _, b in ipairs(TTD_BOUNDS) do
    if waited <= b then return tostring(b) end
  end
  return 'inf'
end

local function ins_reason(now, cell, reason)
  local k = ins_keys(now)
  if not k then return end
  local field = 'x' .. US .. cell .. US .. string.sub(reason, 1, 200)
  if redis.call('HEXISTS', k.day, field) == 0 then
    if tonumber(redis.call('HGET', k.day, '#x') or '0') >= REASONS_PER_DAY then
      field = 'x' .. US .. cell .. US
    else
      redis.call('HINCRBY', k.day, '#x', 1)
    end
  end
  rollup(now, field, 1)
end

-- A request reached its outcome `status` (decided by `by`: a person, `rule:ID`, the sweeper):
-- its outcome, how it was decided, the time a person took (from `created_at`), a reject's
-- reason, and the person's answer count.
local function ins_outcome(now, cell, status, by, reason, created_at)
  local how = 'person'
  if status == 'timed_out' then
    how = 'timeout'
  elseif by and string.sub(by, 1, 5) == 'rule:' then
    how = 'rule'
    rollup(now, 'r' .. US .. cell .. US .. string.sub(by, 6), 1)
  end
  rollup(now, 'o' .. US .. cell .. US .. status .. US .. how, 1)
  if how == 'person' then
    if created_at then
      rollup(now, 't' .. US .. cell .. US .. ins_bound(now - tonumber(created_at)), 1)
    end
    if by then rollup(now, 'p' .. US .. by, 1) end
  end
  if status == 'rejected' and reason then ins_reason(now, cell, reason) end
end

-- Give a pending request its final status, tell its queue, and when it was the last pending
-- call of its run's round, write the resume to the outbox in this same step. `run` holds the
-- run's hash and pending set. A decided request is kept `retention` seconds, then Redis forgets it.
-- Returns the outbox entry's id and the round when it wrote one (else nothing).
local function finish(rkey, id, status, decision_json, event_type, now, run)
  local f = redis.call('HMGET', rkey, 'queue', 'run_id', 'round', 'traceparent',
    'allowed_roles', 'created_by', 'created_at', 'callback')
  redis.call('HSET', rkey, 'status', status, 'decision', decision_json)
  redis.call('EXPIRE', rkey, A.retention)
  redis.call('ZREM', key('expiry'), id)
  redis.call('ZADD', key('requests'), stamp(now), id)  -- the index is by last change
  count('pending:' .. f[1], -1)
  count(status .. ':' .. f[1], 1)
  -- the callback webhook the outcome goes to ('' for none): a notifier routes it unread
  emit(f[1], 'type', event_type, 'request_id', id, 'queue', f[1], 'callback', f[8] or '')
  local resumed
  if f[2] and f[2] ~= '' then
    if redis.call('SREM', run.pending, id) == 1 and redis.call('SCARD', run.pending) == 0 then
      if f[4] then  -- the trace the request was made in goes on to its run's resume job
        resumed = redis.call('XADD', key('resumes'), '*', 'run_id', f[2], 'round', f[3], 'traceparent', f[4])
      else
        resumed = redis.call('XADD', key('resumes'), '*', 'run_id', f[2], 'round', f[3])
      end
      redis.call('HSET', run.hash, 'status', 'queued', 'updated_at', stamp(now))
    end
  end
  index_finished(id, f[1], status, now, f[2] and f[2] ~= '' and run or nil)
  local d = cjson.decode(decision_json)
  ins_outcome(now, ins_cell(f[1], f[5], f[6]), status, ins_text(d.decided_by),
    ins_text(d.reason), f[7])
  return resumed, f[3]
end

-- Move a pending request to another handler queue: still pending, history entry, one more
-- escalation (`escalations`: links minted before it no longer decide), and an
-- `approval.escalated` event on both the old queue and the new one. Deadlines are kept: the
-- queue it leaves keeps the one it had (in the JSON `deadlines`, queue -> epoch seconds), and a
-- queue it returns to gives back its first deadline, so its timeout runs from the first arrival
-- there; a queue it reaches for the first time gives `timeout_s` from `now`. The quorum is
-- raised to `quorum` (the target queue's) when that is more: never lowered. Returns expires_at.
local function move(rkey, id, from, to, now, timeout_s, entry_json, quorum)
  local f = redis.call('HMGET', rkey, 'deadlines', 'expires_at', 'quorum', 'allowed_roles',
    'created_by')
  rollup(now, 'e' .. US .. ins_cell(from, f[4], f[5]), 1)
  if quorum and tonumber(quorum) > tonumber(f[3] or 1) then
    redis.call('HSET', rkey, 'quorum', tostring(tonumber(quorum)))
  end
  local deadlines = (f[1] and f[1] ~= '') and cjson.decode(f[1]) or {}
  deadlines[from] = deadlines[from] or f[2]
  local expires_at = deadlines[to] or stamp(now + tonumber(timeout_s))
  deadlines[to] = expires_at
  redis.call('HSET', rkey, 'queue', to, 'expires_at', expires_at, 'deadlines', cjson.encode(deadlines))
  redis.call('HINCRBY', rkey, 'escalations', 1)
  append_history(rkey, entry_json)
  redis.call('ZADD', key('expiry'), expires_at, id)
  index_moved(id, from, to, expires_at)
  count('pending:' .. from, -1)
  count('pending:' .. to, 1)
  emit(from, 'type', 'approval.escalated', 'request_id', id, 'queue', from, 'from', from, 'to', to)
  emit(to, 'type', 'approval.escalated', 'request_id', id, 'queue', to, 'from', from, 'to', to)
  return expires_at
end

-- A one-time marker (a webhook-id, an email link) checked and spent in the same step as the
-- decision it carries: role `once`, absent for none. Returns true when it was already spent.
local function spent()
  local once = key('once')
  return once and redis.call('EXISTS', once) == 1
end

local function spend()
  local once = key('once')
  if once then redis.call('SET', once, '1', 'EX', A.once_ttl) end
end

-- The two-person rule: count `by`'s approval of the args `hash` towards the request's quorum.
-- One person has one vote: approving the same args again is a repeat (returns 'repeat', 0 and
-- writes nothing); approving other args moves their vote there. Otherwise the vote is stored
-- in the request's `approvals` (JSON array) and the count those args now have is returned.
local function add_vote(rkey, by, hash, channel, now)
  local raw = redis.call('HGET', rkey, 'approvals')
  local votes = {}
  if raw and raw ~= '' and raw ~= '[]' then votes = cjson.decode(raw) end
  local parts, n = {}, 1
  for _, v in ipairs(votes) do
    if v.by == by then
      if v.args_hash == hash then return 'repeat', 0 end
    else
      parts[#parts + 1] = cjson.encode(v)
      if v.args_hash == hash then n = n + 1 end
    end
  end
  parts[#parts + 1] = cjson.encode({by = by, at = iso(now), args_hash = hash, channel = channel})
  redis.call('HSET', rkey, 'approvals', '[' .. table.concat(parts, ',') .. ']')
  return 'counted', n
end

-- Who will have approved `hash` once `by`'s vote counts: the earlier voters for it in order,
-- then `by`; nil when `by` already voted for it (a repeat). Reads only.
local function voters_with(rkey, by, hash)
  local raw = redis.call('HGET', rkey, 'approvals')
  local out = {}
  if raw and raw ~= '' and raw ~= '[]' then
    for _, v in ipairs(cjson.decode(raw)) do
      if v.args_hash == hash then
        if v.by == by then return nil end
        out[#out + 1] = v.by
      end
    end
  end
  out[#out + 1] = by
  return out
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- "I'm on it": until when an acknowledgement holds the sweeper off a request waiting in
-- `queue` (0 for none). An ack is bound to the queue it was given in: once the request has
-- moved on, the new queue's people were not the ones who said they're on it.
local function held_until(rkey, queue)
  local h = redis.call('HMGET', rkey, 'acked_until', 'ack_queue')
  if h[1] and h[1] ~= '' and h[2] == queue then return tonumber(h[1]) or 0 end
  return 0
end

-- The audit trail (docs/audit.md): append one entry to the chain this step got (roles `audit`
-- and `audit_head`; none when `[audit] enabled = false`: nothing is written), with
-- chain.lua's chain_append. Other steps call it as audit(now, request_id, event, actor,
-- actor_kind, outcome, args_hash, detail); every value is a string ('' for none);
-- actor_kind is person|rule|webhook|system.
local function audit(now, request_id, event, actor, actor_kind, outcome, args_hash, detail)
  local stream = key('audit')
  if not stream then return end
  chain_append(stream, key('audit_head'), A.audit_keep, now,
    {request_id, event, actor, actor_kind or 'system', outcome, args_hash, detail})
end
