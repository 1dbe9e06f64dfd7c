-- Append one entry to a request's history; a missing request is left alone.
-- KEYS by role: req. A: entry (JSON text).
local rkey = key('req')
if redis.call('EXISTS', rkey) == 0 then return 0 end
append_history(rkey, A.entry)
return 1
