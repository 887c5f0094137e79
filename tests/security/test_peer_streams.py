"""A stream cannot take a member's snapshots away.

Two real `mesh node` processes, a and b, share a fleet secret; b admits tenants a owns, so
b's verdicts need a's snapshots, which come back on the stream b opened to a. A holder of
the secret opens streams to a under b's id (b's worker_epoch, and a newer one), sends
nothing and closes each after a second, over and over. b's admissions for a's tenants
while that goes on must stay within 5 % of b's admissions without it, measured in the same
test, and a must still count b as one member with its stream open.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc import aio

from bench._procs import read_ready, stop
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._identity import AUTH_MD, sign
from mesh.peer._server import STREAMS_PER_PEER_MAX
from mesh.peer._wire import SCHEMA
from tests.security._nodes import (
    PHASE_S,
    SECRET,
    WITHIN,
    admit_for,
    admitted_share,
    node_configs,
    owned_by_a,
    spawn_node,
    warm,
)

pytestmark = pytest.mark.slow  # two node processes, real gRPC


async def _hijack(addr: str, epoch: int, stop_at: float) -> int:
    """Open a stream to a as b (a good proof), send nothing, close it after a second; again
    until `stop_at`. How many were admitted."""
    opened = 0
    loop = asyncio.get_running_loop()
    async with aio.insecure_channel(addr) as channel:
        while loop.time() < stop_at:
            proof = sign(
                SECRET, member="b", epoch=str(epoch), schema=SCHEMA, target="a",
                now_s=int(time.time()),
            )  # fmt: skip
            md = ((MEMBER_MD, "b"), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(epoch)), (AUTH_MD, proof))
            call = channel.stream_stream(EXCHANGE)(metadata=md)
            try:
                await asyncio.wait_for(call.initial_metadata(), 10)
                if not call.done():
                    opened += 1
                await asyncio.sleep(1.0)
            except (grpc.RpcError, TimeoutError):
                await asyncio.sleep(0.1)
            finally:
                call.cancel()
    return opened


def test_a_stream_under_a_members_id_does_not_take_its_snapshots(tmp_path: Path) -> None:
    cfgs = node_configs(tmp_path)
    procs = {m: spawn_node(tmp_path, c) for m, c in cfgs.items()}
    try:
        ready = {m: read_ready(p) for m, p in procs.items()}
        owned = owned_by_a()
        url = f"http://{ready['b']['sidecar']['http']}"

        async def main() -> tuple[dict[str, int], dict[str, int], int]:
            async with httpx.AsyncClient() as http:
                await warm(http, url, owned, 20)
                baseline = await admit_for(http, url, owned, PHASE_S)
                loop = asyncio.get_running_loop()
                stop_at = loop.time() + PHASE_S + 1.5
                attackers = [
                    loop.create_task(_hijack(ready["a"]["address"], epoch, stop_at))
                    for epoch in (1, 10**12)  # b's own worker_epoch, and a newer one
                ]
                await asyncio.sleep(1.2)  # the first hijacking streams have come and gone
                attacked = await admit_for(http, url, owned, PHASE_S)
                opened = sum(await asyncio.gather(*attackers))
                return baseline, attacked, opened

        baseline, attacked, opened = asyncio.run(main())
        assert opened >= 6, f"the attack opened {opened} streams"  # it really ran
        assert admitted_share(baseline) >= 0.8, baseline  # the baseline itself is healthy
        # the same pace offered in both phases: compare the admitted shares
        assert admitted_share(attacked) >= WITHIN * admitted_share(baseline), (baseline, attacked)
        health = httpx.get(f"http://{ready['a']['telemetry']}/health", timeout=10).json()
        assert "b" in health["peer"]["inbound_streams"], health["peer"]
    finally:
        for p in procs.values():
            stop(p)


async def _hold(addr: str, n: int, stop_at: float) -> int:
    """Keep `n` silent streams open to a under b's id (good proofs), opening a new one as
    soon as one ends, until `stop_at`; how many were opened in all."""
    opened = 0
    loop = asyncio.get_running_loop()
    async with aio.insecure_channel(addr) as channel:

        async def one() -> None:
            nonlocal opened
            while loop.time() < stop_at:
                now_s = int(time.time())
                proof = sign(SECRET, member="b", epoch="1", schema=SCHEMA, target="a", now_s=now_s)
                md = ((MEMBER_MD, "b"), (SCHEMA_MD, SCHEMA), (EPOCH_MD, "1"), (AUTH_MD, proof))
                call = channel.stream_stream(EXCHANGE)(metadata=md)
                try:
                    await asyncio.wait_for(call.initial_metadata(), 10)
                    opened += not call.done()
                    await asyncio.wait_for(call.code(), max(0.1, stop_at - loop.time()))
                except (grpc.RpcError, TimeoutError):
                    pass
                finally:
                    call.cancel()
                await asyncio.sleep(0.05)

        await asyncio.gather(*(one() for _ in range(n)))
    return opened


def test_silent_streams_under_a_members_id_do_not_keep_its_reconnect_out(tmp_path: Path) -> None:
    cfgs = node_configs(tmp_path)
    a = spawn_node(tmp_path, cfgs["a"])
    b = spawn_node(tmp_path, cfgs["b"])
    try:
        ready_a = read_ready(a)
        url = f"http://{read_ready(b)['sidecar']['http']}"
        owned = owned_by_a()

        async def measure(url: str) -> dict[str, int]:
            async with httpx.AsyncClient() as http:
                await warm(http, url, owned, 10)
                return await admit_for(http, url, owned, PHASE_S)

        baseline = asyncio.run(measure(url))
        stop(b)  # b's stream ends; every slot of b at a is the intruder's to take

        async def attacked() -> tuple[dict[str, int], int]:
            nonlocal b
            loop = asyncio.get_running_loop()
            stop_at = loop.time() + PHASE_S + 30
            holder = loop.create_task(_hold(ready_a["address"], STREAMS_PER_PEER_MAX, stop_at))
            await asyncio.sleep(1.5)  # they hold all of b's slots at a
            b = spawn_node(tmp_path, cfgs["b"])  # b comes back: a new stream to a
            got = await measure(f"http://{read_ready(b)['sidecar']['http']}")
            holder.cancel()
            return got, STREAMS_PER_PEER_MAX

        got, _ = asyncio.run(attacked())
        assert admitted_share(baseline) >= 0.8, baseline
        assert admitted_share(got) >= WITHIN * admitted_share(baseline), (baseline, got)
        peer = httpx.get(f"http://{ready_a['telemetry']}/health", timeout=10).json()["peer"]
        assert peer["open_streams"] <= STREAMS_PER_PEER_MAX + 1, peer  # the bound holds
    finally:
        stop(a)
        stop(b)
