"""Faults between members through a TCP proxy: delay, dropped connections, a partition.
A view that cannot hear from its owner goes stale and restricts; it recovers on healing.

The assertions are counts, not speeds: while partitioned a worker admits at most the
allowance it held (its share of b), and after healing it admits again.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bench._procs import free_port
from governor.testing.faults import DelayProxy
from mesh.core.policy import BOUNDS, Metric, RateKey
from mesh.core.ring import Ring
from mesh.core.verdict import Suspension
from mesh.node import Mesh
from tests.mesh._util import POLICY, until

RATE, BURST, LOCAL_B = 1000, 100, 20


def _tenant_owned_by(owner: str, ids: list[str]) -> str:
    ring = Ring(ids, 1)
    return next(
        t
        for t in (f"t{i}" for i in range(1000))
        if ring.owner_of(RateKey(t, Metric.READ_IOPS, 1)) == owner
    )


@pytest.mark.slow
def test_delay_drops_and_partition_between_members() -> None:
    async def main() -> None:
        addr = {m: f"127.0.0.1:{free_port()}" for m in ("a", "b")}
        # what a dials for b, and what b dials for a
        with DelayProxy(addr["b"]) as to_b, DelayProxy(addr["a"]) as to_a:
            via = {
                "a": {"a": addr["a"], "b": to_b.address},
                "b": {"a": to_a.address, "b": addr["b"]},
            }
            tenant = _tenant_owned_by("b", ["a", "b"])
            policy = dict(
                POLICY,
                tenant_id=tenant,
                target_rate=RATE,
                global_burst=BURST,
                local_burst_cap=LOCAL_B,
            )
            cfg = {
                m: {
                    "member_id": m,
                    "listen": addr[m],
                    "shutdown_drain_ms": 200,
                    "membership": {"source": "static", "members": via[m]},
                    "policies": {"inline": [policy]},
                }
                for m in ("a", "b")
            }
            async with Mesh(cfg["a"]) as a, Mesh(cfg["b"]) as b:
                counts = {"admitted": 0}
                stop = asyncio.Event()

                async def load() -> None:  # a offers 2x the limit on b's key
                    while not stop.is_set():
                        counts["admitted"] += sum(
                            a.try_admit(tenant, "read_iops").allowed for _ in range(2)
                        )
                        await asyncio.sleep(0.001)

                task = asyncio.get_running_loop().create_task(load())
                await until(lambda: counts["admitted"] > 200, 5, "healthy traffic")

                to_b.set_delay_ms(5)  # 5 ms each way: slower, still served
                n0 = counts["admitted"]
                await until(lambda: counts["admitted"] > n0 + 100, 5, "served under delay")

                to_b.cut()  # cut the stream: the link reconnects, reports are resent
                n0 = counts["admitted"]
                await until(lambda: counts["admitted"] > n0 + 100, 5, "served after a drop")

                to_b.partition()
                at_partition = counts["admitted"]
                cut_at = time.monotonic()
                await until(
                    lambda: (
                        a.try_admit(tenant, "read_iops").suspended
                        in (Suspension.SNAPSHOT_STALE, Suspension.OWNER_UNREACHABLE)
                    ),
                    5,
                    "view stale",
                )
                await asyncio.sleep(0.3)
                during = counts["admitted"] - at_partition
                # Cut off, it spends what its last allowance left (b at most), then its floor
                # (docs/partitions.md): at most R / members a second, escrowed by the owner.
                floor = RATE * (time.monotonic() - cut_at) / 2
                assert during <= LOCAL_B + floor + 1, (during, LOCAL_B, floor)
                v = a.try_admit(tenant, "read_iops")
                assert v.suspended in (Suspension.SNAPSHOT_STALE, Suspension.OWNER_UNREACHABLE), v
                if v.allowed:  # never silently: a floor's verdict says which bound applied
                    assert v.bound == BOUNDS["global_floor"], v
                else:
                    assert v.bound in (BOUNDS["global_stale"], BOUNDS["global_floor"]), v

                to_b.heal()
                n0 = counts["admitted"]
                await until(lambda: counts["admitted"] > n0 + 100, 10, "recovered after healing")
                stop.set()
                await task
                assert b.health()["status"] == "serving"

    asyncio.run(main())
