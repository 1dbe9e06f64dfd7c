-- Seal a run of audit entries: store the `prev` and `hash` that `broker.audit.sealing`
-- computed for them (in Python, off Redis's one thread) and move the chain's sealed point on.
-- State only: the hashes are taken as given; the step checks that no other sealer moved the
-- chain's sealed point since this one read it, so two sealers never store two versions.
-- KEYS: the chain's head (hash), its seals (stream), its entries (stream). ARGV: the sealed
-- seq read, then the new sealed seq, sealed id and hash, then for each entry sealed its stream
-- id, prev and hash (ids ascending, after the old sealed id). The seals older than the oldest
-- entry left (the entries are trimmed by age as they are appended) are trimmed with them, by
-- XADD's MINID (the ACL in docs/security.md allows XADD, not XTRIM).
-- Returns 1 when stored, 0 when another sealer came first (read again and retry).
local head, seals, stream = KEYS[1], KEYS[2], KEYS[3]
if redis.call('HGET', head, 'sealed') ~= ARGV[1] then return 0 end
local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
local trim = oldest and oldest[1] or ARGV[5]
for i = 5, #ARGV, 3 do
  redis.call('XADD', seals, 'MINID', trim, ARGV[i], 'prev', ARGV[i + 1], 'hash', ARGV[i + 2])
end
redis.call('HSET', head, 'sealed', ARGV[2], 'sealed_id', ARGV[3], 'hash', ARGV[4])
return 1
