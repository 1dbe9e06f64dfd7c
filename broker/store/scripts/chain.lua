-- The audit chain's append, shared by lib.lua's audit() and the notifier's commit.lua (both
-- prepend sha256.lua, then this file). Also the one ISO 8601 formatter of Redis's clock.

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

-- Append one entry to the chain kept in `stream` (and its head hash `head`: last seq and
-- hash, kept apart from the stream so that trimming never restarts the chain). `values` are
-- request_id, event, actor, actor_kind, outcome, args_hash, detail (strings; nil as '').
-- The hash is sha256 over the entry in the form `broker.audit.chain.canonical` writes: each
-- value as `<length>:<value>`, joined by "\n", in AUDIT_FIELDS order, `prev` last. `keep`
-- (seconds, optional) trims entries older than that (MINID, approximate).
local AUDIT_FIELDS = {'seq', 'at', 'request_id', 'event', 'actor', 'actor_kind', 'outcome',
  'args_hash', 'detail', 'prev'}
local function chain_append(stream, head, keep, now, values)
  local h = redis.call('HMGET', head, 'seq', 'hash')
  local seq = tostring((tonumber(h[1]) or 0) + 1)
  local all = {seq, iso(now)}
  for i = 1, 7 do all[i + 2] = values[i] or '' end
  all[10] = h[2] or ''
  local parts, cmd = {}, {'XADD', stream}
  if keep then
    cmd[3], cmd[4], cmd[5] = 'MINID', '~', string.format('%d', math.floor((now - keep) * 1000))
  end
  cmd[#cmd + 1] = '*'
  for i, v in ipairs(all) do
    parts[i] = #v .. ':' .. v
    cmd[#cmd + 1] = AUDIT_FIELDS[i]
    cmd[#cmd + 1] = v
  end
  local digest = sha256(table.concat(parts, '\n'))
  cmd[#cmd + 1] = 'hash'
  cmd[#cmd + 1] = digest
  redis.call(unpack(cmd))
  redis.call('HSET', head, 'seq', seq, 'hash', digest)
end
