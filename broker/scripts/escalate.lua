-- Escalate a pending request to another handler queue by hand (a person's decision).
-- ARGV: prefix, id, target, expires_at, history entry (JSON), args_hash ('' = unchecked), maxlen,
--       once key ('' = none), once ttl
-- Returns {'ok', from} | {'not_found'} | {'replayed'} | {'conflict'} | {'stale_args'}
--         | {'same_queue'}
local id, target, expires_at, entry = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local given_hash, maxlen, once_key, once_ttl = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local key = req_key(id)
local f = redis.call('HMGET', key, 'status', 'queue', 'args_hash')
if not f[1] then return {'not_found'} end
if spent(once_key) then return {'replayed'} end
if f[1] ~= 'pending' then return {'conflict'} end
if given_hash ~= '' and given_hash ~= f[3] then return {'stale_args'} end
if f[2] == target then return {'same_queue'} end
local record = cjson.decode(entry)
record['from_queue'] = f[2]
move(id, f[2], target, expires_at, cjson.encode(record), maxlen)
spend(once_key, once_ttl)
return {'ok', f[2]}
