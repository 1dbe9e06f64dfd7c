-- Append one entry to a request's history; a missing request is left alone.
-- KEYS by role: req; with an audit entry also audit, audit_head (the request's partition's).
-- A: entry (JSON text); optionally event, request_id, actor, actor_kind, outcome, detail: an
--   audit entry of that event in the same step (a shadow rule's match), with the request's
--   args_hash.
local rkey = key('req')
if redis.call('EXISTS', rkey) == 0 then return 0 end
append_history(rkey, A.entry)
if A.event then
  audit(clock(), A.request_id, A.event, A.actor, A.actor_kind, A.outcome,
    redis.call('HGET', rkey, 'args_hash') or '', A.detail)
end
return 1
