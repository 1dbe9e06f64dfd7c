-- A stand-in for a decision: set a request's status and count it, two keys of one hash tag.
redis.call('HSET', KEYS[1], 'status', ARGV[1])
return redis.call('INCR', KEYS[2])
