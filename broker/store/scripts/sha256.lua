-- SHA-256 (FIPS 180-4) in Lua 5.1 with Redis's `bit` and `struct` libraries: Redis's Lua offers
-- only redis.sha1hex, and the audit chain is sha256 (checked against Python's hashlib by
-- tests/integration/test_audit_trail.py). Prepended to every step; defined only where Redis's
-- `bit` and `struct` libraries exist (fakeredis's Lua has no `bit`: `broker.testing` runs with
-- the trail off).
-- Most of an audit entry's Redis time is spent here, so each round makes as few calls into the
-- C libraries as it can: the block's words read by one struct.unpack, sums wrapped with `% 2^32`
-- (Lua numbers are doubles: exact far beyond five 32-bit terms) rather than bit.tobit,
-- ch(e, f, g) as g ^ (e & (f ^ g)), and maj(a, b, c) as b ^ ((a ^ b) & (b ^ c)), whose b ^ c is
-- the round before's a ^ b.
local sha256
if bit and struct then
  local band, bxor = bit.band, bit.bxor
  local rshift, ror, tohex = bit.rshift, bit.ror, bit.tohex
  local unpack_words = struct.unpack
  local K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  }
  local M = 4294967296
  local char, rep = string.char, string.rep
  local WORDS = '>' .. rep('I4', 16)
  local w = {}
  sha256 = function(msg)
    local len = #msg
    local bits = len * 8
    msg = msg .. '\128' .. rep('\0', (55 - len) % 64)
      .. char(0, 0, math.floor(bits / 2 ^ 40) % 256, math.floor(bits / 2 ^ 32) % 256,
        math.floor(bits / 2 ^ 24) % 256, math.floor(bits / 2 ^ 16) % 256,
        math.floor(bits / 2 ^ 8) % 256, bits % 256)
    local h0, h1, h2, h3 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
    local h4, h5, h6, h7 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
    for chunk = 1, #msg, 64 do
      w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], w[10], w[11], w[12], w[13],
        w[14], w[15] = unpack_words(WORDS, msg, chunk)
      for i = 16, 63 do
        local x, y = w[i - 15], w[i - 2]
        w[i] = (w[i - 16] + bxor(ror(x, 7), ror(x, 18), rshift(x, 3)) + w[i - 7]
          + bxor(ror(y, 17), ror(y, 19), rshift(y, 10))) % M
      end
      local a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
      local ab = bxor(b, c)  -- so that the first round finds its b ^ c
      for i = 0, 63 do
        local t1 = h + bxor(ror(e, 6), ror(e, 11), ror(e, 25)) + bxor(g, band(e, bxor(f, g)))
          + K[i + 1] + w[i]
        local bc = ab  -- this round's b ^ c is the last round's a ^ b
        ab = bxor(a, b)
        local t2 = bxor(ror(a, 2), ror(a, 13), ror(a, 22)) + bxor(b, band(ab, bc))
        h, g, f, e = g, f, e, (d + t1) % M
        d, c, b, a = c, b, a, (t1 + t2) % M
      end
      h0, h1, h2, h3 = (h0 + a) % M, (h1 + b) % M, (h2 + c) % M, (h3 + d) % M
      h4, h5, h6, h7 = (h4 + e) % M, (h5 + f) % M, (h6 + g) % M, (h7 + h) % M
    end
    return tohex(h0) .. tohex(h1) .. tohex(h2) .. tohex(h3)
      .. tohex(h4) .. tohex(h5) .. tohex(h6) .. tohex(h7)
  end
end
