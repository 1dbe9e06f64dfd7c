-- Append one audit entry on its own (a rule created or revoked, a receipt spent or refused):
-- the steps that change a request append theirs themselves (lib.lua, audit()). Queued in the
-- caller's MULTI, it is in the same atomic step as the change it records.
-- KEYS by role: audit, audit_head. A: request_id, event, actor, actor_kind, outcome,
--   args_hash, detail (strings, absent for none), audit_keep (seconds, optional).
-- Returns the entry's seq.
audit(clock(), A.request_id, A.event, A.actor, A.actor_kind, A.outcome, A.args_hash, A.detail)
return redis.call('HGET', key('audit_head'), 'seq')
