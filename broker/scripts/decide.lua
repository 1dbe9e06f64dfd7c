-- Decide a pending request: the first decision wins.
-- ARGV: prefix, id, outcome, status, decision (JSON), args_hash ('' = unchecked), now, maxlen,
--       retention (seconds a decided request is kept), queue ('' = unchecked: else the
--       decision only applies while the request waits in that queue), once key ('' = none),
--       once ttl
-- Returns {'ok'} | {'not_found'} | {'replayed'} | {'conflict'} | {'stale_args'}
--         | {'wrong_kind', kind} | {'moved', queue}
local id, outcome, status, decision = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local given_hash, now, maxlen, retention = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local in_queue, once_key, once_ttl = ARGV[10], ARGV[11], ARGV[12]
local key = req_key(id)
local f = redis.call('HMGET', key, 'status', 'kind', 'args_hash', 'queue')
if not f[1] then return {'not_found'} end
if spent(once_key) then return {'replayed'} end
if f[1] ~= 'pending' then return {'conflict'} end
if in_queue ~= '' and in_queue ~= f[4] then return {'moved', f[4]} end
if given_hash ~= '' and given_hash ~= f[3] then return {'stale_args'} end
local kind = f[2]
if (outcome == 'approved' or outcome == 'modified') and kind ~= 'approval' then
  return {'wrong_kind', kind}
end
if outcome == 'answered' and kind == 'approval' then return {'wrong_kind', kind} end
finish(id, status, decision, 'approval.decided', now, maxlen, retention)
spend(once_key, once_ttl)
return {'ok'}
