"""A peer message's decoding cost is bounded by its element count, not only by its bytes.

One 4 MiB message of empty msgpack maps (a byte each) used to build four million dicts on
the owner's loop: 328 MiB more at its peak and the loop held for over a second per message.
A holder of the fleet secret sends several to a real owner a while member b admits a's
tenants: each must be refused (counted `bad_message`), a's peak memory must barely move,
and b's admissions must stay within 5 % of its admissions without the attack.
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
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._identity import AUTH_MD, sign
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

MESSAGES = 4  # bombs sent during the attacked phase
PEAK_GROWTH_MB = 64  # a's peak RSS may grow by at most this (unbounded: +300 MiB a message)


def _bomb() -> bytes:
    """A message just inside the byte limit: one array of empty maps."""
    n = MAX_MESSAGE_BYTES - 1024
    return b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def _send_bombs(addr: str, n: int, every_s: float) -> int:
    """Open a stream as b (a good proof) and send one bomb on it, `n` times; how many
    streams the owner ended."""
    ended = 0
    bomb = _bomb()
    opts = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    async with aio.insecure_channel(addr, options=opts) as channel:
        for _ in range(n):
            proof = sign(
                SECRET, member="b", epoch="1", schema=SCHEMA, target="a", now_s=int(time.time())
            )
            md = ((MEMBER_MD, "b"), (SCHEMA_MD, SCHEMA), (EPOCH_MD, "1"), (AUTH_MD, proof))
            call = channel.stream_stream(EXCHANGE)(metadata=md)
            try:
                await call.write(bomb)
                code = await asyncio.wait_for(call.code(), 10)  # the owner's answer
            except (grpc.RpcError, TimeoutError):
                code = None
            ended += code == grpc.StatusCode.INVALID_ARGUMENT
            call.cancel()
            await asyncio.sleep(every_s)
    return ended


def test_a_message_of_empty_maps_is_refused_cheaply(tmp_path: Path) -> None:
    cfgs = node_configs(tmp_path)
    procs = {m: spawn_node(tmp_path, c) for m, c in cfgs.items()}
    try:
        ready = {m: read_ready(p) for m, p in procs.items()}
        owned = owned_by_a()
        url = f"http://{ready['b']['sidecar']['http']}"
        tel = ready["a"]["telemetry"]

        async def main() -> tuple[dict[str, int], dict[str, int], int, float, float]:
            async with httpx.AsyncClient() as http:
                await warm(http, url, owned, 20)
                baseline = await admit_for(http, url, owned, PHASE_S)
                before = _peak_mb(procs["a"].pid)
                bombs = asyncio.create_task(
                    _send_bombs(ready["a"]["address"], MESSAGES, PHASE_S / MESSAGES)
                )
                attacked = await admit_for(http, url, owned, PHASE_S)
                ended = await bombs
                return baseline, attacked, ended, before, _peak_mb(procs["a"].pid)

        baseline, attacked, ended, before, after = asyncio.run(main())
        refused = httpx.get(f"http://{tel}/health", timeout=10).json()["peer"]["refused"]
        # counted by the owner (what reaches this client can race the stream's reset)
        assert refused["bad_message"] >= MESSAGES and ended >= 1, (ended, refused)
        assert after - before <= PEAK_GROWTH_MB, f"peak RSS {before:.0f} -> {after:.0f} MiB"
        assert admitted_share(baseline) >= 0.8, baseline
        assert admitted_share(attacked) >= WITHIN * admitted_share(baseline), (baseline, attacked)
    finally:
        for p in procs.values():
            stop(p)
