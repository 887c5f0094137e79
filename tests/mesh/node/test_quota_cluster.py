"""Spend quotas across real nodes (real gRPC, etcd membership): the fleet converges on one
cap, and when the key's owner goes away its new owner is rebuilt from the workers' cells
(the folds are never handed over, so a graceful leave is the same loss as a crash)."""

from __future__ import annotations

import asyncio

import pytest

from bench._procs import free_port
from mesh.core.policy import RateKey
from mesh.core.ring import Ring
from mesh.node import Mesh
from tests.mesh._etcd import EtcdServer
from tests.mesh._util import until

pytestmark = pytest.mark.slow  # a real etcd and nodes

CAP = 300
PUBLISH_MS = 50


def _quota(tenant: str) -> dict[str, object]:
    return {
        "tenant_id": tenant,
        "metric": "spend",
        "unit": "usd_micros",
        "generation": 1,
        "period": "day",
        "quota": CAP,
    }


def test_a_new_owner_rebuilds_the_fold_from_the_workers_cells(etcd: EtcdServer) -> None:
    ids = ["a", "b", "c"]
    ring = Ring(ids, 1)
    tenant = next(
        t for t in (f"q{i}" for i in range(500)) if ring.owner_of(RateKey(t, "spend", 1)) == "c"
    )

    async def main() -> None:
        meshes = {
            m: Mesh(
                {
                    "member_id": m,
                    "listen": f"127.0.0.1:{free_port()}",
                    "shutdown_drain_ms": 300,
                    "core": {"quota_publish_ms": PUBLISH_MS},
                    "membership": {
                        "source": "etcd",
                        "endpoints": [etcd.url],
                        "prefix": "/quota/",
                        "lease_ttl_s": 60,
                    },
                    "policies": {"inline": [_quota(tenant)]},
                }
            )
            for m in ids
        }
        for mesh in meshes.values():
            await mesh.astart()
        await until(lambda: all(len(m.ring) == 3 for m in meshes.values()), 10, "joined")
        a, b = meshes["a"], meshes["b"]
        admitted = {m: 0 for m in ids}

        def spend(m: str, n: int) -> None:
            admitted[m] += sum(meshes[m].try_admit(tenant, "spend", 1).allowed for _ in range(n))

        def remote(mesh: Mesh) -> int:
            rows = mesh.health()["quotas"]["quotas"]
            return int(rows[0]["remote"]) if rows else -1

        spend("a", 60)
        spend("b", 40)
        await until(lambda: remote(a) == 40 and remote(b) == 60, 10, "the first folds")
        assert meshes["c"].health()["quotas"]["folds"] == 1  # c owns the key
        await meshes["c"].aclose()  # the owner goes; its folds go with it
        await until(
            lambda: all(m.ring.members == ("a", "b") for m in (a, b)), 10, "c left the ring"
        )
        new_owner = meshes[Ring(["a", "b"], 2).owner_of(RateKey(tenant, "spend", 1))]
        spend("a", 1)  # touch both so both publish each cadence
        spend("b", 1)
        await until(lambda: remote(a) == 41 and remote(b) == 61, 10, "rebuilt from the cells")
        assert new_owner.health()["quotas"]["folds"] == 1
        # The survivors spend the rest: the fleet stays within the cap plus the unfolded lag.
        for _ in range(200):
            spend("a", 3)
            spend("b", 3)
            await asyncio.sleep(PUBLISH_MS / 1000 / 5)
        total = sum(admitted.values())
        lag_bound = 2 * 3 * 5 * 2  # two workers, 3 a step, 5 steps a cadence, two cadences
        assert CAP - 10 <= total <= CAP + lag_bound, admitted
        v = a.try_admit_detailed(tenant, "spend", 1)
        assert v.reason.value == "quota_exhausted" and v.quota is not None
        assert v.quota.cap == CAP and v.quota.lag_ms is not None
        for m in (a, b):
            await m.aclose()

    asyncio.run(main())
