"""The sidecar's waiting form: `timeout_ms` on Admit (gRPC) and in the HTTP body. A denial
waiting can help within the deadline is asked again until admitted; one it cannot is
answered at once; the deadline and the requests waiting are bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import httpx
import pytest

from mesh.sidecar import _wait
from mesh.sidecar import admission_pb2 as pb
from mesh.sidecar._wait import TIMEOUT_MS_MAX
from tests.mesh.sidecar._node import admit_call, insecure, item, node, node_config

BURST = 5  # the node's local limit: 1/s, burst 5 (tests.mesh.sidecar._node)
ONE = {"tenant": "acme", "metric": "read_iops"}


async def _post(addr: str, body: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.post(f"http://{addr}/v1/admit", json=body)


def test_grpc_admit_waits_when_the_deadline_covers_the_retry() -> None:
    async def main() -> None:
        async with node(node_config()) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                admit = admit_call(ch)
                drained = await admit(pb.AdmitRequest(items=[item()] * BURST))
                assert all(v.allowed for v in drained.verdicts)
                # the next unit refills within a second: 100 ms cannot help, answered at once
                short = await admit(pb.AdmitRequest(items=[item()], timeout_ms=100))
                (v,) = short.verdicts
                assert not v.allowed and v.retry_after_ms > 100
                long = await admit(pb.AdmitRequest(items=[item()], timeout_ms=2_500))
                assert [v.allowed for v in long.verdicts] == [True]
                over = admit(pb.AdmitRequest(items=[item()], timeout_ms=TIMEOUT_MS_MAX + 1))
                with pytest.raises(grpc.aio.AioRpcError, match="timeout_ms"):
                    await over

    asyncio.run(main())


def test_http_admit_waits_and_a_bad_timeout_is_400() -> None:
    async def main() -> None:
        async with node(node_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            batch = await _post(addr, {"items": [ONE] * BURST, "timeout_ms": 0})
            assert all(v["allowed"] for v in batch.json()["verdicts"])
            r = await _post(addr, {**ONE, "timeout_ms": 2_500})
            assert r.status_code == 200 and r.json()["allowed"], r.text
            for bad in (-1, "5", TIMEOUT_MS_MAX + 1, 1.5):
                r = await _post(addr, {**ONE, "timeout_ms": bad})
                assert r.status_code == 400 and r.json()["error"].startswith("timeout_ms:")

    asyncio.run(main())


def test_requests_waiting_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past WAITING_MAX waiting, a request is answered at once, as without timeout_ms."""
    monkeypatch.setattr(_wait, "WAITING_MAX", 1)

    async def main() -> None:
        async with node(node_config()) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                admit = admit_call(ch)
                await admit(pb.AdmitRequest(items=[item()] * BURST))
                first = asyncio.ensure_future(
                    admit(pb.AdmitRequest(items=[item()], timeout_ms=2_500))
                )
                await asyncio.sleep(0.2)  # the first is waiting now
                second = await admit(pb.AdmitRequest(items=[item()], timeout_ms=2_500))
                assert not second.verdicts[0].allowed  # turned away at once, not queued
                assert (await first).verdicts[0].allowed

    asyncio.run(main())
