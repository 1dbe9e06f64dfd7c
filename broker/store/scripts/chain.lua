-- The audit chain's append, shared by lib.lua's audit() and the notifier's commit.lua (both
-- prepend this file). Also the one ISO 8601 formatter of Redis's clock.

-- Epoch seconds as ISO 8601 in UTC, the form pydantic writes (days to civil date: H. Hinnant).
local function iso(t)
  local secs = math.floor(t)
  local usec = math.floor((t - secs) * 1000000 + 0.5)
  if usec >= 1000000 then secs, usec = secs + 1, usec - 1000000 end
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06dZ', year, month, day,
    math.floor(rem / 3600), math.floor(rem % 3600 / 60), rem % 60, usec)
end

-- Append one entry to the chain kept in `stream` (its head hash `head`: the last `seq`, kept
-- apart from the stream so that trimming never restarts the chain). `values` are request_id,
-- event, actor, actor_kind, outcome, args_hash, detail (strings; nil as ''). The entry is
-- written without its hash: `broker.audit.sealing` hashes it (sha256 over the form
-- `broker.audit.chain.canonical` writes, `prev` last) in Python a moment later and keeps
-- `prev` and `hash` in `stream`:seals under the entry's id, moving the head's `sealed`,
-- `sealed_id` and `hash` on. A chain from before sealing (every entry hashed in its step) or a
-- new one gets `sealed`/`sealed_id` at its first append here: where the sealer starts.
-- `keep` (seconds, optional) trims entries older than that (MINID, approximate).
local AUDIT_FIELDS = {'seq', 'at', 'request_id', 'event', 'actor', 'actor_kind', 'outcome',
  'args_hash', 'detail'}
local appended = {}  -- this step's last seq per chain head: a bulk step reads each head once
local function chain_append(stream, head, keep, now, values)
  local last = appended[head]
  local first = not last
  if first then
    local h = redis.call('HMGET', head, 'seq', 'sealed')
    last = tonumber(h[1]) or 0
    if not h[2] then
      local tail = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
      redis.call('HSET', head, 'sealed', last, 'sealed_id', tail[1] and tail[1][1] or '0-0')
    end
  end
  local seq = tostring(last + 1)
  appended[head] = last + 1
  local all = {seq, iso(now)}
  for i = 1, 7 do all[i + 2] = values[i] or '' end
  local cmd = {'XADD', stream}
  if keep and first then  -- trimming once per step is enough
    cmd[3], cmd[4], cmd[5] = 'MINID', '~', string.format('%d', math.floor((now - keep) * 1000))
  end
  cmd[#cmd + 1] = '*'
  for i, v in ipairs(all) do
    cmd[#cmd + 1] = AUDIT_FIELDS[i]
    cmd[#cmd + 1] = v
  end
  redis.call(unpack(cmd))
  redis.call('HSET', head, 'seq', seq)
end
