"""Over real gRPC: a leaving member's hand-over that carries an implausible watermark for a
reporter does not make that reporter's reports free."""

from __future__ import annotations

import asyncio

from grpc import aio

from bench._procs import free_port
from mesh.core.messages import Handover, KeyHandover, ReportBatch, ReporterWatermark, encode
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from mesh.membership import MembershipView
from mesh.node import Mesh
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._wire import SCHEMA
from tests.mesh._util import POLICY, until

EPOCH = 7  # both raw members' worker_epoch


async def _send(addr: str, member: str, payloads: list[bytes]) -> None:
    md = ((MEMBER_MD, member), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(EPOCH)))
    async with aio.insecure_channel(addr) as ch:
        call = ch.stream_stream(EXCHANGE)(metadata=md, timeout=10)
        for p in payloads:
            await call.write(p)
        await call.done_writing()
        await asyncio.sleep(0.2)  # let the node take them before the stream goes
        call.cancel()


def test_a_leavers_forged_watermark_does_not_make_a_reporters_usage_free() -> None:
    async def main() -> None:
        addrs = {m: f"127.0.0.1:{free_port()}" for m in ("n", "good", "w")}
        cfg = {
            "member_id": "n",
            "listen": addrs["n"],
            "shutdown_drain_ms": 200,
            "membership": {"source": "static", "members": addrs},
            "policies": {"inline": [{**POLICY, "tenant_id": "*"}]},
        }
        async with Mesh(cfg) as node:
            await until(lambda: len(node.ring) == 3, 5, "the ring {n, good, w}")
            ring, without = node.ring, Ring(["n", "w"], node.ring.epoch + 1)
            key = next(
                k
                for i in range(10_000)
                if ring.owner_of(k := RateKey(f"t{i}", Metric.READ_IOPS, 1)) == "good"
                and without.owner_of(k) == "n"
            )
            # good, leaving, hands the key over with w's watermark at 10**12 ...
            mark = ReporterWatermark("w", EPOCH, 10**12)
            handover = Handover("good", ring.epoch, (KeyHandover(key, 0, 1, 1, (mark,)),))
            await _send(node.address, "good", [encode(handover)])
            owner = node._require().member.owner
            await until(lambda: key in owner.handovers.pending, 5, "the key parked")
            # ... and leaves the ring; w then reports the key to its new owner n.
            node._require().on_membership(
                MembershipView({m: addrs[m] for m in ("n", "w")}, without.epoch)
            )
            reports = [
                ReportBatch("w", without.epoch, EPOCH, (key,), (seq,), (5,), (0,), (1,))
                for seq in (1, 2)
            ]
            await _send(node.address, "w", [encode(r) for r in reports])
            await until(lambda: owner.applied_units >= 10, 5, "w's usage applied")
            health = node.health()["owner"]
            assert health["refused"]["bad_watermark"] == 1
            assert health["duplicates"] == 0 and health["applied_units"] == 10

    asyncio.run(main())
