"""The shared-state tier's I/O: the only mesh code that imports redis and the mesh's only
PostgreSQL client (import-linter contracts say so). A node builds it only when its config
names `shared_state.redis` or `shared_state.postgres` with `external: allow`; the core sees
it through `mesh.core.admission.Counter` (redis mode) and `mesh.core.quota`'s cell tier
Protocol (spend quotas: `RedisCellTier` or `PostgresCellTier`)."""

from mesh.sharedstate._cells import RedisCellTier
from mesh.sharedstate._client import CONNECTIONS_MAX, RedisCounter, redis_client
from mesh.sharedstate._postgres import PostgresCellTier
from mesh.sharedstate._script import GCRA_LUA, GCRA_SHA

__all__ = [
    "CONNECTIONS_MAX",
    "GCRA_LUA",
    "GCRA_SHA",
    "PostgresCellTier",
    "RedisCellTier",
    "RedisCounter",
    "redis_client",
]
