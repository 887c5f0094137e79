"""The spend quotas' Redis cell tier on real nodes (real gRPC, the real Redis on
127.0.0.1:6379; under CI=true a missing Redis fails): each node's driver writes its cells
to the tier off the loop and folds the answer, so remote = max(owner fold, tier fold)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis

from bench._procs import free_port
from mesh.core.policy import RateKey
from mesh.node import Mesh
from mesh.sharedstate import RedisCellTier
from mesh.sharedstate._cells import cell_key
from tests.mesh._redis import connect, text
from tests.mesh._util import until


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = connect()
    yield c
    c.close()


pytestmark = pytest.mark.slow  # nodes on real sockets

QUOTA = {
    "tenant_id": "acme",
    "metric": "tokens_used",
    "unit": "tokens",
    "generation": 1,
    "period": "month",
    "quota": 1000,
}


def test_nodes_fold_the_tier_beside_the_owner(client: redis.Redis) -> None:
    prefix = f"test:cells:{uuid.uuid4().hex}:"
    addr = {m: f"127.0.0.1:{free_port()}" for m in ("a", "b")}

    async def main() -> None:
        meshes = {
            m: Mesh(
                {
                    "member_id": m,
                    "listen": addr[m],
                    "shutdown_drain_ms": 200,
                    "core": {"quota_publish_ms": 50},
                    "membership": {"source": "static", "members": addr},
                    "policies": {"inline": [QUOTA]},
                }
            )
            for m in addr
        }
        for mesh in meshes.values():
            await mesh.astart()
            driver = mesh._require()
            driver.cell_tier = RedisCellTier(client, prefix=prefix)
        a, b = meshes["a"], meshes["b"]
        assert sum(a.try_admit("acme", "tokens_used", 1).allowed for _ in range(30)) == 30
        assert sum(b.try_admit("acme", "tokens_used", 1).allowed for _ in range(20)) == 20

        def remote(mesh: Mesh) -> int:
            rows = mesh.health()["quotas"]["quotas"]
            return int(rows[0]["remote"]) if rows else -1

        await until(lambda: remote(a) == 20 and remote(b) == 30, 10, "both folds")
        await until(lambda: all(m._require().tier_folds > 0 for m in (a, b)), 10, "tier folds")
        key = RateKey("acme", "tokens_used", 1)
        index = a.health()["quotas"]["quotas"][0]["period_index"]
        fields = client.hgetall(cell_key(key, index, prefix))
        burns = {text(k): int(text(v).partition(":")[0]) for k, v in fields.items()}
        assert burns == {"a": 30, "b": 20}
        for m in meshes.values():
            await m.aclose()

    try:
        asyncio.run(main())
    finally:
        for k in client.scan_iter(match=prefix + "*"):
            client.delete(k)
