-- Append one entry (JSON) to a request's history; a missing request is left alone.
-- ARGV: prefix, id, entry
local key = req_key(ARGV[2])
if redis.call('EXISTS', key) == 0 then return 0 end
append_history(key, ARGV[3])
return 1
