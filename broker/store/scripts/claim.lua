-- A live job's claim of the round it waits on, taken only once the round is complete: state
-- only (the caller, broker.runs.live_wait, decides nothing from it but whether to go on).
-- In one step, so the wake-up after an outcome costs one round trip, not a check and a claim:
-- the round's calls all have an outcome (the run's pending set is empty), the round is claimed
-- (HSETNX claimed:N, as the resumer's resume.lua does) and what the claimant goes on with is read.
--
-- KEYS: the run's hash, its pending set, the round's request list, the round's first request
-- ARGV: the claim field (claimed:N), the claimant
-- Reply: {'pending'} (a call still waits: nothing written) | {'other'} (the round is someone
-- else's, or the run is gone) | {'mine', the run's hash, the round's request ids, the first
-- request's hash} (the hashes as flat field, value lists)
local run, field, who = KEYS[1], ARGV[1], ARGV[2]
if redis.call('EXISTS', run) == 0 then
  return {'other'}
end
if redis.call('SCARD', KEYS[2]) > 0 then
  return {'pending'}
end
redis.call('HSETNX', run, field, who)
if redis.call('HGET', run, field) ~= who then
  return {'other'}
end
return {'mine', redis.call('HGETALL', run), redis.call('LRANGE', KEYS[3], 0, -1),
  redis.call('HGETALL', KEYS[4])}
