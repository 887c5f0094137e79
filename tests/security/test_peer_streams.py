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
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio

from bench._procs import free_port, read_ready, spawn, stop, write_config
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._identity import AUTH_MD, sign
from mesh.peer._server import STREAMS_PER_PEER_MAX
from mesh.peer._wire import SCHEMA

pytestmark = pytest.mark.slow  # two node processes, real gRPC

SECRET = b"security-suite-fleet-secret-0123456789"
TENANTS = [f"t{i}" for i in range(24)]
PHASE_S = 5.0  # each measured phase; counts, not rates, are compared
TICK_S = 0.02  # one admit batch per tick
WITHIN = 0.95  # the victim's admissions under attack, at least this share of its baseline


def _policy(tenant: str) -> dict[str, Any]:
    # far above what the test offers: every admission is decided by the owner's news alone
    return {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "mode": "global",
        "target_rate": 1_000_000,
        "global_burst": 1_000_000,
        "local_burst_cap": 100_000,
    }


def _configs(tmp: Path, members: tuple[str, ...] = ("a", "b")) -> dict[str, dict[str, Any]]:
    """Members of one static ring sharing SECRET; each with an HTTP sidecar on loopback."""
    secret = tmp / "fleet-secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    ring = {m: f"127.0.0.1:{free_port()}" for m in members}
    return {
        m: {
            "member_id": m,
            "listen": ring[m],
            "telemetry_listen": "127.0.0.1:0",
            "shutdown_drain_ms": 200,
            "fleet_secret_file": str(secret),
            "membership": {"source": "static", "members": ring},
            "policies": {"inline": [_policy(t) for t in TENANTS]},
            "sidecar": {"http_listen": "127.0.0.1:0"},
        }
        for m in ring
    }


async def _admit_for(
    http: httpx.AsyncClient, url: str, tenants: list[str], seconds: float
) -> dict[str, int]:
    """Offer one unit per tenant every TICK_S for `seconds`; verdicts counted by reason."""
    items = [{"tenant": t, "metric": "read_iops", "amount": 1} for t in tenants]
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        resp = await http.post(f"{url}/v1/admit", json={"items": items}, timeout=10)
        assert resp.status_code == 200, resp.text
        for v in resp.json()["verdicts"]:
            counts[v["reason"]] = counts.get(v["reason"], 0) + 1
        await asyncio.sleep(TICK_S)
    return counts


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


def _spawn(tmp: Path, cfg: dict[str, Any]) -> subprocess.Popen[str]:
    path = write_config(tmp / f"{cfg['member_id']}.json", cfg)
    return spawn(["-m", "mesh.cli", "node", "--config", str(path)])


def _owned_by_a() -> list[str]:
    """The tenants a owns in the ring of a and b."""
    ring = Ring(["a", "b"], 1)
    owned = [t for t in TENANTS if ring.owner_of(RateKey(t, Metric.READ_IOPS, 1)) == "a"]
    assert len(owned) >= 4, owned
    return owned


async def _warm(http: httpx.AsyncClient, url: str, tenants: list[str], timeout_s: float) -> None:
    """Until every item is admitted (b's stream to a carries reports, snapshots come back),
    or `timeout_s`: a victim that never gets there shows in the phase measured next."""
    end = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < end:
        got = await _admit_for(http, url, tenants, 0.1)
        if got.get("admitted", 0) == sum(got.values()):
            return


def _share(counts: dict[str, int]) -> float:
    return counts.get("admitted", 0) / max(1, sum(counts.values()))


def test_a_stream_under_a_members_id_does_not_take_its_snapshots(tmp_path: Path) -> None:
    cfgs = _configs(tmp_path)
    procs = {m: _spawn(tmp_path, c) for m, c in cfgs.items()}
    try:
        ready = {m: read_ready(p) for m, p in procs.items()}
        owned = _owned_by_a()
        url = f"http://{ready['b']['sidecar']['http']}"

        async def main() -> tuple[dict[str, int], dict[str, int], int]:
            async with httpx.AsyncClient() as http:
                await _warm(http, url, owned, 20)
                baseline = await _admit_for(http, url, owned, PHASE_S)
                loop = asyncio.get_running_loop()
                stop_at = loop.time() + PHASE_S + 1.5
                attackers = [
                    loop.create_task(_hijack(ready["a"]["address"], epoch, stop_at))
                    for epoch in (1, 10**12)  # b's own worker_epoch, and a newer one
                ]
                await asyncio.sleep(1.2)  # the first hijacking streams have come and gone
                attacked = await _admit_for(http, url, owned, PHASE_S)
                opened = sum(await asyncio.gather(*attackers))
                return baseline, attacked, opened

        baseline, attacked, opened = asyncio.run(main())
        assert opened >= 6, f"the attack opened {opened} streams"  # it really ran
        assert _share(baseline) >= 0.8, baseline  # the baseline itself is healthy
        # the same pace offered in both phases: compare the admitted shares
        assert _share(attacked) >= WITHIN * _share(baseline), (baseline, attacked)
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
    cfgs = _configs(tmp_path)
    a = _spawn(tmp_path, cfgs["a"])
    b = _spawn(tmp_path, cfgs["b"])
    try:
        ready_a = read_ready(a)
        url = f"http://{read_ready(b)['sidecar']['http']}"
        owned = _owned_by_a()

        async def measure(url: str) -> dict[str, int]:
            async with httpx.AsyncClient() as http:
                await _warm(http, url, owned, 10)
                return await _admit_for(http, url, owned, PHASE_S)

        baseline = asyncio.run(measure(url))
        stop(b)  # b's stream ends; every slot of b at a is the intruder's to take

        async def attacked() -> tuple[dict[str, int], int]:
            nonlocal b
            loop = asyncio.get_running_loop()
            stop_at = loop.time() + PHASE_S + 30
            holder = loop.create_task(_hold(ready_a["address"], STREAMS_PER_PEER_MAX, stop_at))
            await asyncio.sleep(1.5)  # they hold all of b's slots at a
            b = _spawn(tmp_path, cfgs["b"])  # b comes back: a new stream to a
            got = await measure(f"http://{read_ready(b)['sidecar']['http']}")
            holder.cancel()
            return got, STREAMS_PER_PEER_MAX

        got, _ = asyncio.run(attacked())
        assert _share(baseline) >= 0.8, baseline
        assert _share(got) >= WITHIN * _share(baseline), (baseline, got)
        peer = httpx.get(f"http://{ready_a['telemetry']}/health", timeout=10).json()["peer"]
        assert peer["open_streams"] <= STREAMS_PER_PEER_MAX + 1, peer  # the bound holds
    finally:
        stop(a)
        stop(b)
