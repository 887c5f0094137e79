"""The spend quotas' cell tier on Redis (seed 002's mechanism; docs/quotas.md).

One hash per (RateKey, period), one field per worker: "<burn>:<beat_ms>". One Lua script
does the whole flush atomically: set this worker's field to max(old, new) with a beat from
the Redis server's clock (workers need not agree on time), drop fields whose beat is older
than the retention, and return every field left. A field with no beat (written by something
else) is kept, never aged: its age is unknowable, and dropping a live peer's burn would
over-admit. The key is a fixed prefix plus a hash of the scope and period, so tenant ids
stay out of Redis; it expires by itself a retention after its period could have ended.

It implements `mesh.core.quota.CellTier`; the driver calls it off the loop (it blocks on
one round trip) and hands the answer to `QuotaLedger.tier_folded`. The client is the
caller's `redis.Redis` (the node's shared_state client).
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis

from mesh.core.policy import RateKey
from mesh.core.quota import CELL_RETENTION_MS, CELLS_PER_KEY_MAX, DAY_MS

__all__ = ["CELL_KEY_PREFIX", "FORGET_SCAN_COUNT", "TTL_MS", "RedisCellTier", "cell_key"]

CELL_KEY_PREFIX = "ratemesh:cells:"
# A hash outlives its period by at most this much (the longest period is a 31-day month).
TTL_MS = 32 * DAY_MS + CELL_RETENTION_MS

# Keys one SCAN step asks for while a member is forgotten (each step is one round trip).
FORGET_SCAN_COUNT = 512

# Burns compare as decimal strings (exact past Lua's 2^53 doubles): longer is larger.
_SCRIPT = """
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, burn = ARGV[1], ARGV[2]
local retention, cells_max = tonumber(ARGV[3]), tonumber(ARGV[4])
local old = redis.call('HGET', KEYS[1], member)
if old then
  local ob = string.match(old, '^(%d+):')
  if ob and gt(ob, burn) then burn = ob end
end
if old or redis.call('HLEN', KEYS[1]) < cells_max then
  redis.call('HSET', KEYS[1], member, burn .. ':' .. now)
end
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local beat = string.match(all[i + 1], '^%d+:(%d+)$')
  if beat and now - tonumber(beat) > retention then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return out
"""


def cell_key(key: RateKey, period_index: int, prefix: str = CELL_KEY_PREFIX) -> str:
    """The Redis key of one (RateKey, period) hash: no tenant id in clear."""
    digest = hashlib.sha256(f"{key.ring_token()}\x1f{period_index}".encode()).hexdigest()
    return prefix + digest[:32]


class RedisCellTier:
    """`CellTier` on a `redis.Redis` client: one script call per (key, period) flush."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        retention_ms: int = CELL_RETENTION_MS,
        cells_max: int = CELLS_PER_KEY_MAX,
        prefix: str = CELL_KEY_PREFIX,
    ) -> None:
        self.client = client
        self.retention_ms = retention_ms
        self.cells_max = cells_max
        self.prefix = prefix
        self._script = client.register_script(_SCRIPT)
        self.malformed = 0  # fields whose burn could not be read (ignored: counted here)

    def exchange(
        self, now_ms: int, key: RateKey, period_index: int, member: str, burn: int
    ) -> dict[str, int]:
        """Write `member`'s cell as max(old, burn) and return every live cell. `now_ms` is
        unused: the server's clock beats. Raises redis.RedisError when Redis fails."""
        if burn < 0:
            raise ValueError(f"burn must be >= 0, got {burn}")
        reply: Any = self._script(
            keys=[cell_key(key, period_index, self.prefix)],
            args=[member, str(burn), self.retention_ms, self.cells_max, TTL_MS],
        )
        out: dict[str, int] = {}
        for i in range(0, len(reply) - 1, 2):
            name, value = _text(reply[i]), _text(reply[i + 1])
            head = value.partition(":")[0]
            if not head.isdigit():
                self.malformed += 1
                continue
            out[name] = int(head)
        return out

    def forget_member(self, member: str) -> int:
        """Purge a decommissioned member's cells by name, in every hash under the prefix;
        the fields deleted. Raises redis.RedisError when Redis fails."""
        dropped = 0
        for key in self.client.scan_iter(match=self.prefix + "*", count=FORGET_SCAN_COUNT):
            dropped += int(self.client.hdel(key, member))
        return dropped


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
