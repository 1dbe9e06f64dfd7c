-- The second step of a sweep: escalate each request due.lua listed to its queue's escalate_to
-- (still pending) or time it out. Each is checked again here, since another sweeper or a
-- decision may have got there between the two steps: only one still pending and still due
-- (on this step's clock) is touched. A request a routing rule gave `on_timeout = reject` is timed
-- out even where its queue would escalate it.
-- KEYS by role: expiry, requests, counts, resumes; streams; per item key_of(id, ...) `req`, and
--   `run` and `pending` of the run the caller takes it to belong to.
-- A: items = [{id, run (optional)}], routes = {queue = {to = name|false, timeout = s}},
--   reason (the timed-out reason, "%s" for the seconds waited), maxlen, retention, now
--   (optional: else Redis's clock).
-- Returns a flat list: id, action, from, to-or-''; action is 'escalated' or 'timed_out', or
-- 'need_stream' / 'need_run' with the lacking queue or run in place of `from` (call again for
-- that id with those keys; nothing was written for it).
local now = clock()
local now_iso = iso(now)
local routes = A.routes
local out = {}
local function add(id, action, from, to)
  out[#out + 1] = id; out[#out + 1] = action; out[#out + 1] = from; out[#out + 1] = to
end
for _, item in ipairs(A.items) do
  local id = item.id
  local rkey = key_of(id, 'req')
  local score = redis.call('ZSCORE', key('expiry'), id)
  if score and tonumber(score) <= now then
    local f = redis.call('HMGET', rkey, 'status', 'queue', 'created_at', 'run_id', 'args_hash',
      'on_timeout')
    local held = f[1] == 'pending' and held_until(rkey, f[2]) or 0
    if f[1] ~= 'pending' then
      redis.call('ZREM', key('expiry'), id)
    elseif held > now then  -- someone said "I'm on it": not before the ack runs out
      redis.call('ZADD', key('expiry'), stamp(held), id)
    else
      local queue = f[2]
      local route = routes[queue]
      local to = route and route['to']
      if not (to and to ~= cjson.null and routes[to]) then to = nil end
      if f[6] == 'reject' then to = nil end  -- a routing rule said: time out, never escalate
      local lack = lacking(queue, to, f[4], item.run)
      if lack then
        add(id, lack[1], lack[2], '')
      elseif to then
        local entry = cjson.encode({at = now_iso, event = 'escalated', by = 'sweeper',
          from_queue = queue, to_queue = to, reason = 'no decision in queue ' .. queue .. ' in time'})
        move(rkey, id, queue, to, now, routes[to]['timeout'], entry, routes[to]['quorum'])
        audit(now, id, 'escalated', 'sweeper', 'system', '', f[5], cjson.encode({from = queue, to = to}))
        add(id, 'escalated', queue, to)
      else
        local waited = string.format('%d', math.floor(now - tonumber(f[3] or now) + 0.5))
        local decision = cjson.encode({outcome = 'timed_out', decided_by = 'sweeper',
          decided_at = now_iso, reason = string.gsub(A.reason, '%%s', waited)})
        local run = item.run and {hash = key_of(id, 'run'), pending = key_of(id, 'pending'),
          requests = key_of(id, 'run_requests')}
        finish(rkey, id, 'timed_out', decision, 'approval.timed_out', now, run)
        audit(now, id, 'timed_out', 'sweeper', 'system', 'timed_out', f[5], '')
        add(id, 'timed_out', queue, '')
      end
    end
  end
end
return out
