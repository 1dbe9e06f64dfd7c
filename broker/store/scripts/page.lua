-- Read one page of a listing index, after a cursor, in one atomic read (nothing is written).
-- KEYS by role: index. A: limit, rev (true: highest score first), and the cursor: s (the score
--   of the last item already seen, as Redis gave it) and i (its id); none for the first page.
-- The order is (score, id) with ids compared bytewise, as the sorted set keeps them, so ties in
-- score are broken by id: the page starts just after (s, i) whether or not i is still there.
-- Returns a flat list: id, score, id, score... at most `limit`.
local z, n, rev = key('index'), tonumber(A.limit), A.rev
local range = rev and 'ZREVRANGE' or 'ZRANGE'

-- bytewise a < b (Lua's `<` follows the server's collation locale)
local function lt(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local start = 0
if A.i then
  local s, id = A.s, A.i
  local now_s = redis.call('ZSCORE', z, id)
  if now_s and tonumber(now_s) == tonumber(s) then
    start = redis.call(rev and 'ZREVRANK' or 'ZRANK', z, id) + 1
  else
    -- the cursor's item is gone or moved: find the first position past (s, id) among the
    -- items tied at score s, by bisection on rank (O(log N) per probe)
    local lo
    if rev then lo = redis.call('ZCOUNT', z, '(' .. s, '+inf')
    else lo = redis.call('ZCOUNT', z, '-inf', '(' .. s) end
    local hi = lo + redis.call('ZCOUNT', z, s, s)
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local m = redis.call(range, z, mid, mid)[1]
      local past
      if rev then past = lt(m, id) else past = lt(id, m) end
      if past then hi = mid else lo = mid + 1 end
    end
    start = lo
  end
end
return redis.call(range, z, start, start + n - 1, 'WITHSCORES')
