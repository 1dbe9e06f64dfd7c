-- Shared helpers, prepended to the scripts that change a request's state.
-- ARGV[1] is always the key prefix; the key names mirror broker/keys.py.
local prefix = ARGV[1]

local function req_key(id) return prefix .. 'req:' .. id end

-- Append one JSON object to the request's JSON `history` array.
local function append_history(key, entry_json)
  local h = redis.call('HGET', key, 'history')
  if (not h) or h == '' or h == '[]' then
    h = '[' .. entry_json .. ']'
  else
    h = string.sub(h, 1, -2) .. ',' .. entry_json .. ']'
  end
  redis.call('HSET', key, 'history', h)
end

-- Fleet-wide gauges and counters for /metrics: `pending:QUEUE` and `STATUS:QUEUE`.
local function count(field, by)
  redis.call('HINCRBY', prefix .. 'counts', field, by)
end

local function emit(queue, maxlen, ...)
  redis.call('XADD', prefix .. 'stream:' .. queue, 'MAXLEN', '~', maxlen, '*', ...)
end

-- Give a pending request its final status, tell its queue, and when it was the last
-- pending call of its run's round, write the resume to the outbox in this same step.
-- A decided request is kept `retention` seconds, then Redis forgets it.
local function finish(id, status, decision_json, event_type, now, maxlen, retention)
  local key = req_key(id)
  local f = redis.call('HMGET', key, 'queue', 'run_id', 'round')
  redis.call('HSET', key, 'status', status, 'decision', decision_json)
  redis.call('EXPIRE', key, retention)
  redis.call('ZREM', prefix .. 'expiry', id)
  redis.call('ZADD', prefix .. 'requests', now, id)  -- the index is by last change
  count('pending:' .. f[1], -1)
  count(status .. ':' .. f[1], 1)
  emit(f[1], maxlen, 'type', event_type, 'request_id', id, 'queue', f[1])
  local run_id = f[2]
  if run_id and run_id ~= '' then
    local pending = prefix .. 'run:' .. run_id .. ':pending'
    if redis.call('SREM', pending, id) == 1 and redis.call('SCARD', pending) == 0 then
      redis.call('XADD', prefix .. 'resumes', '*', 'run_id', run_id, 'round', f[3])
      redis.call('HSET', prefix .. 'run:' .. run_id, 'status', 'queued', 'updated_at', now)
    end
  end
end

-- Move a pending request to another handler queue: still pending, new expiry, history
-- entry, and an `approval.escalated` event on both the old queue and the new one.
local function move(id, from, to, expires_at, entry_json, maxlen)
  local key = req_key(id)
  redis.call('HSET', key, 'queue', to, 'expires_at', expires_at)
  append_history(key, entry_json)
  redis.call('ZADD', prefix .. 'expiry', expires_at, id)
  count('pending:' .. from, -1)
  count('pending:' .. to, 1)
  emit(from, maxlen, 'type', 'approval.escalated', 'request_id', id, 'queue', from, 'from', from, 'to', to)
  emit(to, maxlen, 'type', 'approval.escalated', 'request_id', id, 'queue', to, 'from', from, 'to', to)
end

-- A one-time marker (a webhook-id, an email link) checked and spent in the same step as the
-- decision it carries: '' means none. Returns true when it was already spent.
local function spent(once_key)
  return once_key ~= '' and redis.call('EXISTS', once_key) == 1
end

local function spend(once_key, ttl)
  if once_key ~= '' then redis.call('SET', once_key, '1', 'EX', ttl) end
end
