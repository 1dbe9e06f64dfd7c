-- Put requests stored before the listing indexes existed into them (broker/reindex.py).
-- KEYS by role (all of one partition, so one slot on a cluster): the partition's indexes and
-- each queue's (keys.py `_shared`); per item
--   key_of(id, ...) `req`, and `creator` / `run_requests` when the request has them.
-- A: ids. Each is read here, in the step: a request decided or moved since the caller looked is
-- indexed as it is now. A request of a queue whose keys were not given is skipped.
-- Returns the number indexed.
local done = 0
for _, id in ipairs(A.ids) do
  local f = redis.call('HMGET', key_of(id, 'req'), 'status', 'queue', 'created_at', 'expires_at')
  local status, queue = f[1], f[2]
  if status and key('queue:' .. queue) then
    local last = redis.call('ZSCORE', key('requests'), id) or f[3]
    if status == 'pending' then
      redis.call('ZADD', key('pending:' .. queue), f[4], id)
    elseif key('done:' .. status) then
      redis.call('ZADD', key('done:' .. status), last, id)
      redis.call('ZADD', key('done:' .. status .. ':' .. queue), last, id)
    end
    redis.call('ZADD', key('queue:' .. queue), last, id)
    for _, role in ipairs({'creator', 'run_requests'}) do
      local z = key_of(id, role)
      if z then redis.call('ZADD', z, f[3], id) end
    end
    done = done + 1
  end
end
return done
