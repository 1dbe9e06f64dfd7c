-- Decide a pending request: the first decision wins.
-- KEYS by role: req, once (a one-time marker, optional), run and pending (the run the caller
--   takes the request to belong to, optional), expiry, requests, counts, resumes; streams.
-- A: id, outcome, status, decision (JSON text, decided_at is added here), args_hash (optional:
--   else unchecked), in_queue (optional: else the decision applies in any queue), run_id (the
--   run whose keys were given), once_ttl, maxlen, retention; for the two-person rule: voter
--   (the person approving), vote_hash (the args approved, default the request's), channel,
--   creator_may_vote (the admin and the shell), bypass_quorum (a policy rule allowed to);
--   receipt_votes (optional: the voters the decision's receipt names, for a quorum).
--   actor, actor_kind (who, for the audit entry: `voted` or `decided`); claimant (optional:
--   a caller that enqueues the round's resume job itself, right after this step: see below).
-- Returns reply(): {'ok'} | {'replayed'} | {'conflict'} | {'stale_args'} | {'wrong_kind', kind}
--   | {'moved', queue} | {'creator'} | {'repeat'} | {'voted', count}, each followed by the
--   request's fields; or {'not_found'}, or {'need_stream', queue} / {'need_run', run_id} (call
--   again with those keys; nothing written), or {'need_votes', voters JSON}: the deciding vote
--   of a quorum whose receipt names other voters than these (sign again; nothing written).
local rkey = key('req')
local f = redis.call('HMGET', rkey, 'status', 'kind', 'args_hash', 'queue', 'run_id')
if not f[1] then return {'not_found', ''} end

if spent() then return reply(rkey, 'replayed') end
if f[1] ~= 'pending' then return reply(rkey, 'conflict') end
if A.in_queue and A.in_queue ~= f[4] then return reply(rkey, 'moved', f[4]) end
if A.in_escalation and A.in_escalation ~= tonumber(redis.call('HGET', rkey, 'escalations') or 0) then return reply(rkey, 'moved', f[4]) end
if A.args_hash and A.args_hash ~= f[3] then return reply(rkey, 'stale_args') end
local kind, outcome = f[2], A.outcome
if (outcome == 'approved' or outcome == 'modified') and kind ~= 'approval' then
  return reply(rkey, 'wrong_kind', kind)
end
if outcome == 'answered' and kind == 'approval' then return reply(rkey, 'wrong_kind', kind) end
local lack = lacking(f[4], nil, f[5], A.run_id)
if lack then return lack end
local now = clock()
-- The two-person rule, once the request is known to be decidable: the creator never counts;
-- below the quorum an approval is a vote (the request stays pending); the Nth vote for the
-- same args decides it, below, exactly as a single approval does.
if A.voter and (outcome == 'approved' or outcome == 'modified') then
  local g = redis.call('HMGET', rkey, 'created_by', 'quorum')
  if A.voter == g[1] and not A.creator_may_vote then return reply(rkey, 'creator') end
  local quorum = tonumber(g[2]) or 1
  if quorum > 1 and not A.bypass_quorum then
    if A.receipt_votes then
      local voters = voters_with(rkey, A.voter, A.vote_hash or f[3])
      if voters and #voters >= quorum and not same_list(voters, A.receipt_votes) then
        return {'need_votes', cjson.encode(voters)}
      end
    end
    local counted, n = add_vote(rkey, A.voter, A.vote_hash or f[3], A.channel or '', now)
    if counted == 'repeat' then return reply(rkey, 'repeat') end
    if n < quorum then
      emit(f[4], 'type', 'approval.voted', 'request_id', A.id, 'queue', f[4])
      rollup(now, 'p' .. US .. A.voter, 1)
      audit(now, A.id, 'voted', A.actor, A.actor_kind, outcome, A.vote_hash or f[3], '')
      spend()
      return reply(rkey, 'voted', tostring(n))
    end
  end
end
local decision = with_fields(A.decision, {{'decided_at', iso(now)}})
local resumed, round = finish(rkey, A.id, A.status, decision, 'approval.decided', now,
  {hash = key('run'), pending = key('pending')})
audit(now, A.id, 'decided', A.actor, A.actor_kind, A.status, A.vote_hash or f[3], '')
spend()
-- The round's last outcome, for a caller that enqueues the resume itself (`claimant`): the
-- round is claimed for the resume job here, as the resumer's claim step would (resume.lua),
-- unless a live job still waits for it or someone owns it; then the reply's detail is
-- 'ENTRY_ID ROUND' (the outbox entry stays for the resumer should the caller die first).
local detail = ''
if resumed and A.claimant then
  local live_until = redis.call('HGET', key('run'), 'live_until:' .. round)
  if not (live_until and tonumber(live_until) > now)
      and redis.call('HSETNX', key('run'), 'claimed:' .. round, A.claimant) == 1 then
    detail = resumed .. ' ' .. round
  end
end
return reply(rkey, 'ok', detail)
