-- The outbox's resume step for a batch of entries, atomic (so no WATCH and no retry): per
-- entry, a run that is gone is left pending (the caller dead-letters it); otherwise the round
-- is claimed for the resumer (HSETNX, as broker.live_wait does), its RQ job is written exactly
-- as RQ's enqueue_many would (the job hash, RPUSH on the queue list, SADD of the queue) unless a live job
-- owns the round or the job exists already, and the entry is acknowledged and deleted.
--
-- KEYS: outbox stream, RQ's set of queues, the queue's list, then per entry: run hash, job hash
-- ARGV: group, claimant, timestamp (created_at = enqueued_at), number of constant job fields,
--       the constant fields (name, value, ...), then per entry: entry id, claim field, job id,
--       job data (RQ's zlib'd JSON), description
-- A round nobody claimed yet whose live job still waits for it (`live_until:N` on the run, set
-- by broker.live_wait, later than Redis's clock) is left alone, entry unacknowledged: the live
-- job goes on with it in the same job, or the resumer takes it once that deadline passed.
-- Reply: one word per entry: enqueued | duplicate | live | gone | deferred
local stream, queues, queue = KEYS[1], KEYS[2], KEYS[3]
local group, who, at = ARGV[1], ARGV[2], ARGV[3]
local nconst = tonumber(ARGV[4])
local fields = {'created_at', at, 'enqueued_at', at, 'data', '', 'description', ''}
for i = 5, 4 + 2 * nconst do
  fields[#fields + 1] = ARGV[i]
end
local base = 5 + 2 * nconst
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local out, acks, listed = {}, {}, false
for i = 1, (#KEYS - 3) / 2 do
  local run, job = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  local a = base + 5 * (i - 1)
  local entry, field, job_id = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local live_until = redis.call('HGET', run, 'live_until:' .. string.sub(field, 9))  -- claimed:N
  if redis.call('EXISTS', run) == 0 then
    out[i] = 'gone'
  elseif live_until and tonumber(live_until) > now and not redis.call('HGET', run, field) then
    out[i] = 'deferred'
  else
    redis.call('HSETNX', run, field, who)
    if redis.call('HGET', run, field) ~= who then
      out[i] = 'live'
    elseif redis.call('EXISTS', job) == 1 then
      out[i] = 'duplicate'
    else
      if not listed then
        redis.call('SADD', queues, queue)
        listed = true
      end
      fields[6], fields[8] = ARGV[a + 3], ARGV[a + 4]
      redis.call('HSET', job, unpack(fields))
      redis.call('RPUSH', queue, job_id)
      out[i] = 'enqueued'
    end
    acks[#acks + 1] = entry
  end
end
if #acks > 0 then
  redis.call('XACK', stream, group, unpack(acks))
  redis.call('XDEL', stream, unpack(acks))
end
return out
