-- Handle up to `limit` requests whose expiry is due, in one step: escalate each to its
-- queue's escalate_to (still pending) or time it out. Cost grows with what is due only.
-- ARGV: prefix, now, now_iso, limit, routes (JSON {queue: {to = name|false, timeout = s}}),
--       maxlen, timed-out decision template (JSON with "%s" for the seconds waited), retention

-- Returns a flat list: id, action ('escalated'|'timed_out'), from, to-or-''.
local now, now_iso, limit = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local routes, maxlen = cjson.decode(ARGV[5]), ARGV[6]
local template, retention = ARGV[7], tonumber(ARGV[8])
-- Forget index entries whose last change is older than the retention (their hashes have
-- expired); a request still pending that long is kept, its entry moved to now.
local stale = redis.call('ZRANGEBYSCORE', prefix .. 'requests', '-inf', now - retention, 'LIMIT', 0, limit)
for _, id in ipairs(stale) do
  if redis.call('ZSCORE', prefix .. 'expiry', id) then
    redis.call('ZADD', prefix .. 'requests', now, id)
  else
    redis.call('ZREM', prefix .. 'requests', id)
  end
end
local due = redis.call('ZRANGEBYSCORE', prefix .. 'expiry', '-inf', now, 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(due) do
  local key = req_key(id)
  local f = redis.call('HMGET', key, 'status', 'queue', 'created_at')
  if f[1] ~= 'pending' then
    redis.call('ZREM', prefix .. 'expiry', id)
  else
    local queue = f[2]
    local route = routes[queue]
    local to = route and route['to']
    if to and to ~= cjson.null and routes[to] then
      local expires_at = now + tonumber(routes[to]['timeout'])
      local entry = cjson.encode({at = now_iso, event = 'escalated', by = 'sweeper',
        from_queue = queue, to_queue = to, reason = 'no decision in queue ' .. queue .. ' in time'})
      move(id, queue, to, string.format('%.6f', expires_at), entry, maxlen)
      out[#out + 1] = id; out[#out + 1] = 'escalated'; out[#out + 1] = queue; out[#out + 1] = to
    else
      local waited = string.format('%d', math.floor(now - tonumber(f[3] or now) + 0.5))
      local decision = string.gsub(template, '%%s', waited)
      finish(id, 'timed_out', decision, 'approval.timed_out', ARGV[2], maxlen, retention)
      out[#out + 1] = id; out[#out + 1] = 'timed_out'; out[#out + 1] = queue; out[#out + 1] = ''
    end
  end
end
return out
