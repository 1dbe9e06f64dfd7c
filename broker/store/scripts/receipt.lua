-- A receipt at execution: spend its jti with the record of the tool starting, or record a refusal.
-- The checks (signature, expiry, tool, args, roles) are made by the caller (broker/receipts/checks.py);
-- this step keeps state only: whether the jti was spent, and the records.
-- KEYS by role: req, spent (the jti's marker), counts, run (optional: the run hash counting the
--   tools of a marked step), audit/audit_head (optional: the audit chain); the request's queue
--   stream. Both outcomes append an audit entry (`receipt_spent`, `receipt_refused`).
-- A: id, queue, maxlen; mode = 'spend' (jti_ttl, run_field optional) | 'refuse' (reason).
-- Returns {'ok'} (spent now: the tool may run), {'spent'} (spent before: refused and recorded
--   as such) or {'refused'}.
local rkey = key('req')
local now = clock()
local args_hash = redis.call('HGET', rkey, 'args_hash') or ''

local function refuse(reason)
  count('receipt_refused:' .. reason, 1)
  audit(now, A.id, 'receipt_refused', 'worker', 'system', 'refused', args_hash, reason)
  if redis.call('EXISTS', rkey) == 1 then
    append_history(rkey, cjson.encode({at = iso(now), event = 'receipt_refused', detail = reason}))
  end
  if stream_of(A.queue) then
    emit(A.queue, 'type', 'approval.receipt_refused', 'request_id', A.id, 'queue', A.queue,
      'reason', reason)
  end
end

if A.mode == 'refuse' then
  refuse(A.reason)
  return {'refused'}
end
local spent = key('spent')
if redis.call('SET', spent, '1', 'NX', 'EX', A.jti_ttl) == false then
  refuse('spent')
  return {'spent'}
end
if A.run_field and key('run') then redis.call('HINCRBY', key('run'), A.run_field, 1) end
count('receipt_spent', 1)
audit(now, A.id, 'receipt_spent', 'worker', 'system', 'spent', args_hash, '')
if redis.call('EXISTS', rkey) == 1 then
  append_history(rkey, cjson.encode({at = iso(now), event = 'receipt_spent'}))
end
return {'ok'}
