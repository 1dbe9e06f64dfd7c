-- Decide a pending approval request AND keep the rule its decider asked to remember, in one
-- step; the same step decides, by that rule, the pending siblings of the run it covers, so the
-- round resumes exactly once (finish() writes the resume with the last outcome).
-- KEYS by role: what decide.lua gets (req, once, run, pending, expiry, requests, counts,
--   resumes; streams), plus rule (the new rule's hash), rule_index (its tool's index set),
--   rule_listing, rule_version, rule_hits, and key_of(id, 'req') of each sibling.
-- A: what decide.lua gets (id, outcome, status, decision, args_hash, in_queue, in_escalation,
--   run_id, once_ttl, maxlen, retention, voter, creator_may_vote), plus entry (the history entry of the decided request, JSON
--   text without `at`), rule = {id, effect, fields = {name = value}} (created_at is set here),
--   siblings = [{id, decision, entry}] (JSON text; decided_at / at are set here) and
--   sibling_status; actor, actor_kind (who, for the audit entries: `rule_created` (its detail
--   the rule id) on a single Redis, `decided`; the siblings' are by the rule).
-- Returns what decide.lua returns, or {'rule_exists', id} (nothing written). A sibling decided
-- meanwhile by someone else is left as it is.
-- On a Redis Cluster the rules are in a slot of their own: KEYS has no rule keys, the caller
-- wrote the rule just before (its own single-slot step) and counts the siblings' hits after.
local rkey = key('req')
local f = redis.call('HMGET', rkey, 'status', 'kind', 'args_hash', 'queue', 'run_id')
if not f[1] then return {'not_found', ''} end
if spent() then return reply(rkey, 'replayed') end
if f[1] ~= 'pending' then return reply(rkey, 'conflict') end
if A.in_queue and A.in_queue ~= f[4] then return reply(rkey, 'moved', f[4]) end
if A.in_escalation and A.in_escalation ~= tonumber(redis.call('HGET', rkey, 'escalations') or 0) then return reply(rkey, 'moved', f[4]) end
if A.args_hash and A.args_hash ~= f[3] then return reply(rkey, 'stale_args') end
if f[2] ~= 'approval' then return reply(rkey, 'wrong_kind', f[2]) end
-- the two-person rule, as decide.lua: the one who asked never approves (nor remembers an allow)
if A.voter and A.outcome == 'approved' and not A.creator_may_vote
  and A.voter == redis.call('HGET', rkey, 'created_by') then
  return reply(rkey, 'creator')
end
local lack = lacking(f[4], nil, f[5], A.run_id)
if lack then return lack end
for _, s in ipairs(A.siblings) do
  local sf = redis.call('HMGET', key_of(s.id, 'req'), 'queue', 'run_id')
  if sf[1] and sf[2] == f[5] then
    lack = lacking(sf[1], nil, sf[2], A.run_id)
    if lack then return lack end
  end
end
local rule_key = key('rule')
if rule_key and redis.call('EXISTS', rule_key) == 1 then return {'rule_exists', A.rule.id} end

local now = clock()
local created = stamp(now)
if rule_key then
  local flat = {'created_at', created}
  for name, value in pairs(A.rule.fields) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  redis.call('HSET', rule_key, unpack(flat))
  redis.call('SADD', key('rule_index'), A.rule.id)
  redis.call('ZADD', key('rule_listing'), created, A.rule.id)
  redis.call('INCRBY', key('rule_version'), 1)
  audit(now, A.id, 'rule_created', A.actor, A.actor_kind, A.rule.effect, '', A.rule.id)
end

local run = {hash = key('run'), pending = key('pending')}
local decided_at = {{'decided_at', iso(now)}}
local at = {{'at', iso(now)}}
finish(rkey, A.id, A.status, with_fields(A.decision, decided_at), 'approval.decided', now, run)
append_history(rkey, with_fields(A.entry, at))
audit(now, A.id, 'decided', A.actor, A.actor_kind, A.status, f[3], '')
spend()
for _, s in ipairs(A.siblings) do
  local skey = key_of(s.id, 'req')
  local sf = redis.call('HMGET', skey, 'status', 'run_id')
  if sf[1] == 'pending' and sf[2] == f[5] then
    finish(skey, s.id, A.sibling_status, with_fields(s.decision, decided_at), 'approval.decided',
      now, run)
    append_history(skey, with_fields(s.entry, at))
    audit(now, s.id, 'decided', 'rule:' .. A.rule.id, 'rule', A.sibling_status,
      redis.call('HGET', skey, 'args_hash') or '', '')
    if rule_key then
      redis.call('HINCRBY', rule_key, 'hits', 1)
      redis.call('HSET', rule_key, 'last_hit_at', created)
      redis.call('HINCRBY', key('rule_hits'), A.rule.effect .. ':' .. A.rule.id, 1)
    end
  end
end
return reply(rkey, 'ok')
