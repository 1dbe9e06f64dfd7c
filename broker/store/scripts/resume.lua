-- The resumer's claim for a batch of outbox entries: state only. It claims each completed
-- round for the resumer and says what to do with its entry; the resume jobs themselves are
-- enqueued afterwards by RQ's own enqueue_many (broker.runs.resume_step), so no RQ key is written
-- here (on a single Redis the jobs' keys are read, to skip a job that exists already).
--
-- KEYS: per entry its run hash, then (when ARGV[2] is '1') per entry its RQ job hash
-- ARGV: claimant, '1' if the job keys follow else '0', then per entry its round number
-- Per entry: a run that is gone is left alone (the caller dead-letters its entry); a round
-- nobody claimed yet whose live job still waits for it (`live_until:N` on the run, set by
-- broker.runs.live_wait, later than Redis's clock) is left alone too, so the live job can go on
-- with it in the same job (the resumer looks again once that deadline passed); otherwise the
-- round is claimed (HSETNX claimed:N, as broker.runs.live_wait does) and the first claimant owns it.
-- Reply: one word per entry: enqueue (claimed, no job yet) | duplicate (claimed, its job
-- exists) | live (a live job owns the round) | deferred | gone
local who, with_jobs = ARGV[1], ARGV[2] == '1'
local n = #ARGV - 2
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local out = {}
for i = 1, n do
  local run, round = KEYS[i], ARGV[2 + i]
  local field = 'claimed:' .. round
  if redis.call('EXISTS', run) == 0 then
    out[i] = 'gone'
  else
    local owner = redis.call('HGET', run, field)
    local live_until = redis.call('HGET', run, 'live_until:' .. round)
    if not owner and live_until and tonumber(live_until) > now then
      out[i] = 'deferred'
    else
      if not owner then
        redis.call('HSET', run, field, who)
        owner = who
      end
      if owner ~= who then
        out[i] = 'live'
      elseif with_jobs and redis.call('EXISTS', KEYS[n + i]) == 1 then
        out[i] = 'duplicate'
      else
        out[i] = 'enqueue'
      end
    end
  end
end
return out
