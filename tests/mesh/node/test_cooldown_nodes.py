"""Over real gRPC, three nodes in one process: a 429 reported on one node cools the limit on
the others through the key's owner, every verdict says `suspended: cooldown` (on /health
too), and the limit admits again when it ends."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench._procs import free_port
from mesh.core.verdict import Reason, Suspension
from mesh.errors import ConfigError
from mesh.node import Mesh
from tests.mesh._util import POLICY, until


def test_a_429_on_one_node_cools_the_limit_on_every_node() -> None:
    async def main() -> None:
        addrs = {m: f"127.0.0.1:{free_port()}" for m in ("a", "b", "c")}

        def cfg(m: str) -> dict[str, object]:
            return {
                "member_id": m,
                "listen": addrs[m],
                "shutdown_drain_ms": 200,
                "membership": {"source": "static", "members": addrs},
                "policies": {"inline": [{**POLICY, "tenant_id": "*", "target_rate": 100_000}]},
            }

        async with Mesh(cfg("a")) as a, Mesh(cfg("b")) as b, Mesh(cfg("c")) as c:
            nodes = [a, b, c]
            await until(lambda: all(len(n.ring) == 3 for n in nodes), 10, "the ring")
            for _ in range(20):  # every node reports acme: each is one of its reporters
                for n in nodes:
                    n.try_admit("acme", "read_iops")
                await asyncio.sleep(0.01)
            with pytest.raises(ConfigError, match="cooldown_s"):
                a.report_429("acme", "read_iops", cooldown_s=-1)
            started = time.monotonic()
            a.report_429("acme", "read_iops", cooldown_s=1.5)
            assert a.try_admit("acme", "read_iops").reason is Reason.COOLDOWN  # at once here

            def cooled() -> bool:
                for n in nodes:
                    n.try_admit("acme", "read_iops")
                return all(
                    n.try_admit("acme", "read_iops").suspended is Suspension.COOLDOWN for n in nodes
                )

            await until(cooled, 1.0, "every node cooling acme")
            reached_s = time.monotonic() - started
            assert reached_s < 1.0
            detailed = c.try_admit_detailed("acme", "read_iops")
            assert detailed.retry_after_ms is not None and 0 < detailed.retry_after_ms <= 1500
            suspended = [
                {k: v for k, v in s.items() if k != "owner"} for s in c.health()["suspended"]
            ]  # each also names the key's owner (/ui shows it)
            assert {"tenant": "acme", "metric": "read_iops", "reason": "cooldown"} in suspended
            assert b.try_admit("other", "read_iops").allowed
            await until(
                lambda: all(n.try_admit("acme", "read_iops").allowed for n in nodes),
                5,
                "the cooldown over everywhere",
            )
            assert time.monotonic() - started >= 1.4

    asyncio.run(main())
