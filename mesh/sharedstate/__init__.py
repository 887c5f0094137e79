"""The shared-state tier's I/O: the only mesh code that imports redis (an import-linter
contract says so). A node builds it only when its config names `shared_state.redis` with
`external: allow`; the core sees it through `mesh.core.admission.Counter` (redis mode) and
`mesh.core.quota`'s cell tier Protocol (spend quotas, `RedisCellTier`)."""

from mesh.sharedstate._cells import RedisCellTier
from mesh.sharedstate._client import CONNECTIONS_MAX, RedisCounter, redis_client
from mesh.sharedstate._script import GCRA_LUA, GCRA_SHA

__all__ = [
    "CONNECTIONS_MAX",
    "GCRA_LUA",
    "GCRA_SHA",
    "RedisCellTier",
    "RedisCounter",
    "redis_client",
]
