"""The GCRA step as a Lua script: `mesh.core.admission._counter.gcra_step`, line for line.

It runs on the Redis server clock (`redis.call('TIME')`), so replicas need not agree on a
clock. The key holds the theoretical arrival time as "tat_us:rem" and expires (PX) when the
bucket would be full again, redis-cell style. Lua numbers are doubles: every value here is
an integer below 2**53 while rate and burst are at most `NUMBER_MAX` (the core sends no
other), and divisions go through `divmod`, which corrects the double's rounding.

ARGV[4], when given, replaces the server clock: only tests pass it, to pin this script to
`gcra_step` on random inputs (tests/mesh/sharedstate/test_script.py).
"""

from __future__ import annotations

import hashlib

__all__ = ["GCRA_LUA", "GCRA_SHA"]

GCRA_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local amount = tonumber(ARGV[3])
local now_us
if ARGV[4] then
  now_us = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end
local function ceil_div(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end
local function ms_ceil(us)
  if us > 0 then return ceil_div(us, 1000) end
  return 0
end
local tat_us, rem = now_us, 0
local held = redis.call('GET', KEYS[1])
if held then
  local sep = string.find(held, ':', 1, true)
  tat_us = tonumber(string.sub(held, 1, sep - 1))
  rem = tonumber(string.sub(held, sep + 1))
end
if tat_us < now_us then tat_us = now_us; rem = 0 end
local tau = burst * 1000000
local q, new_rem = divmod(rem + amount * 1000000, rate)
local new_us = tat_us + q
local ahead = (new_us - now_us) * rate + new_rem
if ahead <= tau then
  local reset = ms_ceil(ceil_div(ahead, rate))
  redis.call('SET', KEYS[1], string.format('%.0f:%.0f', new_us, new_rem), 'PX', math.max(reset, 1))
  local left = divmod(tau - ahead, 1000000)
  return {1, left, 0, reset}
end
local was = (tat_us - now_us) * rate + rem
local left = 0
if tau > was then left = divmod(tau - was, 1000000) end
local retry = ms_ceil(ceil_div(ahead - tau, rate))
if retry < 1 then retry = 1 end
return {0, left, retry, ms_ceil(ceil_div(was, rate))}
"""
GCRA_SHA = hashlib.sha1(GCRA_LUA.encode()).hexdigest()  # what EVALSHA names
