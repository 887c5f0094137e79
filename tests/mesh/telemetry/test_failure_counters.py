"""Failures the node used to count and never show are Prometheus counters (docs/telemetry.md):
bad replies on a peer link, the cell tier's failed calls, and the collections run because
peer streams were refused. Two real nodes over loopback gRPC."""

from __future__ import annotations

import asyncio

from mesh.node import Mesh
from tests.mesh._util import POLICY, static_nodes

EVERY_TENANT = dict(POLICY, tenant_id="*")


def counter(node: Mesh, name: str) -> float:
    for line in node._require().telemetry.render().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported")


def test_bad_replies_tier_errors_and_refused_collections_are_exported() -> None:
    async def main() -> None:
        cfg_a, cfg_b = static_nodes(["a", "b"], [EVERY_TENANT])
        async with Mesh(cfg_a) as a, Mesh(cfg_b):
            driver = a._require()
            links = driver.transport.links  # type: ignore[attr-defined]
            tenant = 0
            while "b" not in links:  # usage of keys b owns opens a's link to b
                a.try_admit(f"t{tenant}", "read_iops")
                tenant += 1
                await asyncio.sleep(0.001 if tenant % 20 == 0 else 0)
                assert tenant < 5000, "no key owned by b"
            assert counter(a, "ratemesh_peer_bad_replies_total") == 0
            links["b"]._take(b"\xc1")  # not msgpack: what a broken peer might answer
            assert counter(a, "ratemesh_peer_bad_replies_total") == 1
            # b leaves a's view: its link closes, and the count stays (a counter)
            driver.transport.set_peers({"a": a.address})
            assert "b" not in links
            assert counter(a, "ratemesh_peer_bad_replies_total") == 1
            driver.tier_errors += 2
            driver.refused_collections += 3
            assert counter(a, "ratemesh_cell_tier_errors_total") == 2
            assert counter(a, "ratemesh_refused_stream_collections_total") == 3

    asyncio.run(main())
