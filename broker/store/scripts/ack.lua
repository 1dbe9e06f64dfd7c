-- "I'm on it": keep a pending request where it is and hold the sweeper off it for a while.
-- The request stays pending and its outcome is untouched; the acknowledgement is recorded in
-- its history, and its expiry entry is pushed to at least now + hold_s (the sweeper honours
-- `acked_until` too, see held_until). A second ack pushes it again. An `approval.acked` event
-- goes on the queue's stream, so Slack messages and open inboxes show it at once.
-- KEYS by role: req, expiry; the stream of in_queue. A: id, by, channel, hold_s, maxlen,
-- in_queue (optional: without it, or its stream, no event is written).
-- Returns reply(): {'ok', until} | {'conflict'} (no longer pending) | {'moved', queue}, each
-- followed by the request's fields; or {'not_found'}. Nothing is written unless 'ok'.
local rkey = key('req')
local f = redis.call('HMGET', rkey, 'status', 'queue')
if not f[1] then return {'not_found', ''} end
if f[1] ~= 'pending' then return reply(rkey, 'conflict') end
if A.in_queue and A.in_queue ~= f[2] then return reply(rkey, 'moved', f[2]) end
local now = clock()
local hold = now + tonumber(A.hold_s)
local score = tonumber(redis.call('ZSCORE', key('expiry'), A.id) or '0') or 0
if hold > score then redis.call('ZADD', key('expiry'), stamp(hold), A.id) end
redis.call('HSET', rkey, 'acked_until', stamp(hold), 'ack_queue', f[2], 'acked_by', A.by)
append_history(rkey, cjson.encode({at = iso(now), event = 'acked', by = A.by,
  channel = A.channel, detail = 'escalation paused until ' .. iso(hold)}))
if stream_of(f[2]) then emit(f[2], 'type', 'approval.acked', 'request_id', A.id, 'queue', f[2]) end
return reply(rkey, 'ok', stamp(hold))
