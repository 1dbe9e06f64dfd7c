-- One committer batch in one step (single Redis only): done markers, history notes, delivery
-- counters, then the acknowledgements, in that order, so an entry is never acknowledged before
-- its done markers. Each write is a pcall: one that Redis refuses is counted and skipped, the
-- rest still happen (like the pipeline's `raise_on_error=False`), and the step never stops
-- half-way through a batch.
-- ARGV[1] group; ARGV[2..5] counts: done markers D, notes N, counters C, streams S.
-- KEYS: D delivery hashes, N request hashes, the stats hash (when C > 0), S streams.
-- ARGV after the counts: D done fields, N history entries (JSON), C (name, by) pairs, then per
-- stream its number of ids and the ids.
-- Then, with the audit trail on (chain.lua comes first: `FLAT` in broker/store/scripts): ARGV
-- the chain's `keep` seconds and the N notes' request ids; KEYS the chain's stream and head,
-- last. Each `delivered` / `delivery_failed` note appends an audit entry of that event (actor:
-- the channel). Run by `broker.store.delivery_commits`.
-- Replies {refused, first refusal's message}.
local group = ARGV[1]
local nd, nn, nc, ns = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local k, a = 1, 6
local refused, first = 0, ''

local function try(...)
  local ok = redis.pcall(...)
  if type(ok) == 'table' and ok.err then
    refused = refused + 1
    if first == '' then first = ok.err end
  end
  return ok
end

for _ = 1, nd do
  try('HSET', KEYS[k], ARGV[a], '1')
  k, a = k + 1, a + 1
end
local notes_k, notes_a = k, a
for _ = 1, nn do
  -- the history is a JSON array kept as text: append without decoding it (broker lib.lua's
  -- append_history); a request that is gone is left alone
  local rkey, entry = KEYS[k], ARGV[a]
  if redis.call('EXISTS', rkey) == 1 then
    local h = try('HGET', rkey, 'history')
    if type(h) ~= 'table' then
      if (not h) or h == '' or h == '[]' then
        h = '[' .. entry .. ']'
      else
        h = string.sub(h, 1, -2) .. ',' .. entry .. ']'
      end
      try('HSET', rkey, 'history', h)
    end
  end
  k, a = k + 1, a + 1
end
if nc > 0 then
  for _ = 1, nc do
    try('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  k = k + 1
end
for _ = 1, ns do
  local n = tonumber(ARGV[a])
  try('XACK', KEYS[k], group, unpack(ARGV, a + 1, a + n))
  k, a = k + 1, a + 1 + n
end
local keep = ARGV[a]
if keep and keep ~= '' then
  local stream, head = KEYS[k], KEYS[k + 1]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  for i = 0, nn - 1 do
    local rkey = KEYS[notes_k + i]
    local ok, entry = pcall(cjson.decode, ARGV[notes_a + i])
    if ok and (entry.event == 'delivered' or entry.event == 'delivery_failed')
      and redis.call('EXISTS', rkey) == 1 then
      local channel = type(entry.channel) == 'string' and entry.channel or ''
      chain_append(stream, head, tonumber(keep), now, {ARGV[a + 1 + i], entry.event, channel,
        'system', '', redis.call('HGET', rkey, 'args_hash') or '', channel})
    end
  end
end
return {refused, first}
