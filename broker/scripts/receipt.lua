-- A receipt at execution: spend its jti with the record of the tool starting, or record a refusal.
-- The checks (signature, expiry, tool, args, roles) are made by the caller (broker/receipt_checks.py);
-- this step keeps state only: whether the jti was spent, and the records.
-- KEYS by role: req, spent (the jti's marker), counts, run (optional: the run hash counting the
--   tools of a marked step); the request's queue stream.
-- A: id, queue, maxlen; mode = 'spend' (jti_ttl, run_field optional) | 'refuse' (reason).
-- Returns {'ok'} (spent now: the tool may run), {'spent'} (spent before: refused and recorded
--   as such) or {'refused'}.
local rkey = key('req')

local function refuse(reason)
  count('receipt_refused:' .. reason, 1)
  if redis.call('EXISTS', rkey) == 1 then
    append_history(rkey, cjson.encode({at = iso(clock()), event = 'receipt_refused', detail = reason}))
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
if redis.call('EXISTS', rkey) == 1 then
  append_history(rkey, cjson.encode({at = iso(clock()), event = 'receipt_spent'}))
end
return {'ok'}
