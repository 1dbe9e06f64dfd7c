-- Append one entry to a request's history; a missing request is left alone.
-- KEYS by role: req; with an audit entry also audit, audit_head (the request's partition's).
-- A: entry (JSON text); optionally event, request_id, actor, actor_kind, outcome, detail: an
--   audit entry of that event in the same step (a shadow rule's match), with the request's
--   args_hash; and optionally emit (an event type) with maxlen: that event on the stream of the
--   request's queue (its streams come as KEYS streams), naming `rule` (detail) and `effect`
--   (outcome).
local rkey = key('req')
if redis.call('EXISTS', rkey) == 0 then return 0 end
append_history(rkey, A.entry)
if A.event then
  audit(clock(), A.request_id, A.event, A.actor, A.actor_kind, A.outcome,
    redis.call('HGET', rkey, 'args_hash') or '', A.detail)
end
if A.emit then
  local queue = redis.call('HGET', rkey, 'queue')
  if queue and stream_of(queue) then
    emit(queue, 'type', A.emit, 'request_id', A.request_id, 'queue', queue,
      'rule', A.detail or '', 'effect', A.outcome or '')
  end
end
return 1
