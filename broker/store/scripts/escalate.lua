-- Escalate a pending request to another handler queue by hand (a person's decision).
-- KEYS by role: req, once (optional), expiry, counts; streams (of its queue and the target).
-- A: id, target, timeout_s (of the target queue: applies from the request's first arrival
--   there, see move), quorum (optional: the target queue's, raises the request's), entry (history JSON text: at and from_queue are added here), args_hash
--   (optional), in_queue and in_escalation (optional: else unchecked; the escalation only
--   applies while the request waits in that queue, after that many escalations), once_ttl, maxlen,
--   actor, actor_kind (who, for the audit entry).
-- Returns reply(): {'ok', from} | {'replayed'} | {'conflict'} | {'stale_args'} | {'same_queue'}
--   | {'moved', queue}, each followed by the request's fields; or {'not_found'} or
--   {'need_stream', queue}.
local rkey = key('req')
local f = redis.call('HMGET', rkey, 'status', 'queue', 'args_hash', 'escalations')
if not f[1] then return {'not_found', ''} end
if spent() then return reply(rkey, 'replayed') end
if f[1] ~= 'pending' then return reply(rkey, 'conflict') end
if A.in_queue and A.in_queue ~= f[2] then return reply(rkey, 'moved', f[2]) end
if A.in_escalation and A.in_escalation ~= tonumber(f[4] or 0) then return reply(rkey, 'moved', f[2]) end
if A.args_hash and A.args_hash ~= f[3] then return reply(rkey, 'stale_args') end
local from, target = f[2], A.target
if from == target then return reply(rkey, 'same_queue') end
local lack = lacking(from, target, nil, nil)
if lack then return lack end
local now = clock()
local entry = with_fields(A.entry, {{'at', iso(now)}, {'from_queue', from}})
move(rkey, A.id, from, target, now, A.timeout_s, entry, A.quorum)
audit(now, A.id, 'escalated', A.actor, A.actor_kind, '', f[3], cjson.encode({from = from, to = target}))
spend()
return reply(rkey, 'ok', from)
