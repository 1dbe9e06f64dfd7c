-- Move a value from KEYS[1] to KEYS[2] in one step: a multi-key script, as the broker's are.
local value = redis.call('GET', KEYS[1])
if not value then
  return nil
end
redis.call('SET', KEYS[2], value)
redis.call('DEL', KEYS[1])
return value
