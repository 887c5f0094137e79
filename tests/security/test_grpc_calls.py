"""Half-open gRPC calls hold nothing before a credential is checked.

A caller that sends a call's headers and never its request used to hold a slot (and about
18 KB) on every gRPC listener: 1,100 on a node's peer port refused an honest member's new
stream, 256 on the sidecar blocked an authorised Admit, and governord took them without
bound. Each test here holds such calls open (no credential, or a wrong one) against a real
process while a legitimate caller works, and checks that the intruders are answered at once
and refused, and that the legitimate caller's admissions stay within 5 % of its admissions
without them, measured in the same test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio

from bench._procs import read_ready, stop
from governor import wire
from mesh.peer import MEMBER_MD, STATUS
from mesh.peer._identity import AUTH_MD
from mesh.sidecar import admission_pb2 as pb
from tests.governor._daemon import KEYS, Daemon
from tests.governor._stores import make_target
from tests.security._nodes import (
    PHASE_S,
    TICK_S,
    WITHIN,
    admit_for,
    admitted_share,
    node_configs,
    owned_by_a,
    spawn_node,
    warm,
)

pytestmark = pytest.mark.slow  # real processes, real gRPC

ANSWERED_S = 20.0  # every intruding call must have its status within this (a loaded host)


@asynccontextmanager
async def half_open(
    addr: str, path: str, metadata: list[tuple[tuple[str, str], ...]], n: int
) -> AsyncIterator[list[aio.StreamStreamCall[bytes, bytes]]]:
    """`n` calls of `path` (metadata taken in turn) whose request never comes: headers
    only, spread over channels (a connection takes a bounded number of streams)."""
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection each (not one shared)
    channels = [aio.insecure_channel(addr, options=own) for _ in range(max(1, n // 128))]
    calls = [
        channels[i % len(channels)].stream_stream(path)(metadata=metadata[i % len(metadata)])
        for i in range(n)
    ]
    try:
        await asyncio.sleep(1.0)  # their headers are out
        yield calls
    finally:
        for c in calls:
            c.cancel()
        await asyncio.gather(*(ch.close() for ch in channels))


async def answered(calls: list[aio.StreamStreamCall[bytes, bytes]]) -> dict[str, int]:
    """Each call's status code (name), waiting at most ANSWERED_S in all; `open` for a call
    still without one. A refusal that races the server's reset of the stream (it ends a
    call whose client has not finished sending) reaches the client as CANCELLED."""

    async def one(c: aio.StreamStreamCall[bytes, bytes]) -> str:
        try:
            return str((await c.code()).name)
        except asyncio.CancelledError:
            return "CANCELLED"

    tasks = [asyncio.ensure_future(one(c)) for c in calls]
    done, pending = await asyncio.wait(tasks, timeout=ANSWERED_S)
    counts: dict[str, int] = {"open": len(pending)}
    for t in done:
        counts[t.result()] = counts.get(t.result(), 0) + 1
    for t in pending:
        t.cancel()
    return counts


# -- the peer port ---------------------------------------------------------------------------


def refused_all(codes: dict[str, int], code: str, n: int) -> bool:
    """All `n` calls ended (none open), refused `code` or reset under it (CANCELLED)."""
    ended = {k: v for k, v in codes.items() if v}
    return ended.get(code, 0) >= 0.9 * n and set(ended) <= {code, "CANCELLED"}


def test_half_open_status_calls_do_not_keep_a_member_from_streaming(tmp_path: Path) -> None:
    cfgs = node_configs(tmp_path)
    a = spawn_node(tmp_path, cfgs["a"])
    b = spawn_node(tmp_path, cfgs["b"])
    try:
        ready_a = read_ready(a)
        owned = owned_by_a()
        url = f"http://{read_ready(b)['sidecar']['http']}"

        async def measure() -> dict[str, int]:
            async with httpx.AsyncClient() as http:
                await warm(http, url, owned, 20)
                return await admit_for(http, url, owned, PHASE_S)

        baseline = asyncio.run(measure())
        stop(b)  # b comes back while the calls are held: it needs a new stream to a

        async def attacked() -> tuple[dict[str, int], dict[str, int], dict[str, Any]]:
            nonlocal b
            no_proof = ((MEMBER_MD, "b"),)
            bad_proof = ((MEMBER_MD, "b"), (AUTH_MD, "v1:1:" + "0" * 24 + ":" + "0" * 64))
            async with half_open(ready_a["address"], STATUS, [no_proof, bad_proof], 1100) as calls:
                b = spawn_node(tmp_path, cfgs["b"])
                url_b = f"http://{read_ready(b)['sidecar']['http']}"
                async with httpx.AsyncClient() as http:
                    await warm(http, url_b, owned, 10)
                    got = await admit_for(http, url_b, owned, PHASE_S)
                codes = await answered(calls)
            tel = ready_a["telemetry"]
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"http://{tel}/health", timeout=10)).json()
            return got, codes, health

        got, codes, health = asyncio.run(attacked())
        assert admitted_share(baseline) >= 0.8, baseline
        assert admitted_share(got) >= WITHIN * admitted_share(baseline), (baseline, got, codes)
        # every intruder was answered PERMISSION_DENIED, none holds anything
        assert refused_all(codes, "PERMISSION_DENIED", 1100), codes
        refused = health["peer"]["refused"]
        assert refused["bad_secret"] >= 550, refused  # the wrong proofs, counted
        assert health["peer"]["inbound_streams"] == ["b"], health["peer"]
    finally:
        stop(a)
        stop(b)


# -- the sidecar's Admission API -------------------------------------------------------------

TOKEN = "sidecar-token-for-the-security-suite-0123"


async def _admit_calls(addr: str, seconds: float) -> dict[str, int]:
    """An authorised worker: one Admit of one unit every TICK_S; verdicts counted by
    reason, failed calls by status."""
    md = (("authorization", f"Bearer {TOKEN}"),)
    req = pb.AdmitRequest(items=[pb.AdmitItem(tenant="t0", metric="read_iops", amount=1)])
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    async with aio.insecure_channel(addr) as channel:
        call = channel.unary_unary(
            "/ratemesh.sidecar.v1.Admission/Admit",
            request_serializer=pb.AdmitRequest.SerializeToString,
            response_deserializer=pb.AdmitResponse.FromString,
        )
        while loop.time() < end:
            try:
                resp = await call(req, metadata=md, timeout=10)
            except grpc.RpcError as exc:
                name = exc.code().name if isinstance(exc, aio.AioRpcError) else "error"
                counts[name] = counts.get(name, 0) + 1
            else:
                for v in resp.verdicts:
                    counts[v.reason] = counts.get(v.reason, 0) + 1
            await asyncio.sleep(TICK_S)
    return counts


def test_half_open_calls_do_not_block_an_authorised_admit(tmp_path: Path) -> None:
    token = tmp_path / "sidecar-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    cfg = node_configs(tmp_path, ("solo",))["solo"]
    for p in cfg["policies"]["inline"]:
        p["mode"] = "local"
    cfg["sidecar"] = {"grpc_listen": "127.0.0.1:0", "require_auth": True, "token_file": str(token)}
    node = spawn_node(tmp_path, cfg)
    try:
        addr = read_ready(node)["sidecar"]["grpc"]

        async def main() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
            baseline = await _admit_calls(addr, PHASE_S)
            no_token: tuple[tuple[str, str], ...] = ()
            wrong = (("authorization", "Bearer not-the-token"),)
            path = "/ratemesh.sidecar.v1.Admission/Admit"
            async with half_open(addr, path, [no_token, wrong], 400) as calls:
                got = await _admit_calls(addr, PHASE_S)
                codes = await answered(calls)
            return baseline, got, codes

        baseline, got, codes = asyncio.run(main())
        assert admitted_share(baseline) >= 0.8, baseline
        assert admitted_share(got) >= WITHIN * admitted_share(baseline), (baseline, got, codes)
        assert refused_all(codes, "UNAUTHENTICATED", 400), codes
    finally:
        stop(node)


# -- governord --------------------------------------------------------------------------------


def _consume_for(addr: str, node_id: int, seconds: float) -> dict[str, int]:
    """Tenant a's worker: one Consume every TICK_S with its key; answers by status."""
    counts: dict[str, int] = {}
    body = wire.pack({"v": 1, "node_id": node_id, "resource": "http"})
    md = ((wire.KEY_MD, KEYS["KEY_A"]),)
    with grpc.insecure_channel(addr) as channel:
        fn = channel.unary_unary(wire.path("Consume"))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                fn(body, metadata=md, timeout=10)
                counts["admitted"] = counts.get("admitted", 0) + 1
            except grpc.RpcError as exc:
                counts[exc.code().name] = counts.get(exc.code().name, 0) + 1
            time.sleep(TICK_S)
    return counts


def test_governord_answers_half_open_calls_without_credentials_at_once(tmp_path: Path) -> None:
    for store in make_target("sqlite", tmp_path):
        tenants = {
            "a": {"api_key_env": "KEY_A", "quotas": {"http": 10**9}},
            "b": {"api_key_env": "KEY_B", "weight": 1},
        }
        daemon = Daemon(tmp_path, store, tenants=tenants)
        daemon.start()
        try:
            with grpc.insecure_channel(daemon.addr) as ch:
                md = ((wire.KEY_MD, KEYS["KEY_A"]),)
                open_s = ch.unary_unary(wire.path("OpenSession"))
                token = wire.unpack(open_s(wire.pack({"v": 1, "ttl_ms": 60_000}), metadata=md))
                create = ch.unary_unary(wire.path("CreateNode"))
                body = wire.pack({"v": 1, "name": "job", "quotas": {"http": 10**9}})
                made = create(body, metadata=((wire.TOKEN_MD, token["token"]),))
                node_id = int(wire.unpack(made)["node_id"])
            baseline = _consume_for(daemon.addr, node_id, PHASE_S)

            async def main(
                addr: str, node_id: int
            ) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
                none: tuple[tuple[str, str], ...] = ()
                forged = ((wire.TOKEN_MD, "forged-token-0123456789"),)
                bad_key = ((wire.KEY_MD, "not-a-key"),)
                mds = [none, forged, bad_key]
                async with (
                    half_open(addr, wire.path("Consume"), mds, 1500) as unary,
                    half_open(addr, wire.path(wire.MULTIPLEX), mds, 300) as mux,
                ):
                    got = await asyncio.to_thread(_consume_for, addr, node_id, PHASE_S)
                    return got, await answered(unary), await answered(mux)

            got, unary, mux = asyncio.run(main(daemon.addr, node_id))
            assert admitted_share(baseline) >= 0.8, baseline
            assert admitted_share(got) >= WITHIN * admitted_share(baseline), (baseline, got)
            assert refused_all(unary, "UNAUTHENTICATED", 1500), unary
            assert refused_all(mux, "UNAUTHENTICATED", 300), mux
        finally:
            daemon.close()
