"""In-flight slots and chunked egress through the public `Mesh` API (docs/api.md): a
concurrency limit caps the node's in-flight gauge at C (local) or ceil(C / N_live) (share),
from threads and from asyncio; a TTL'd slot frees itself; an origin loader waits for a
slot; a streamed response is charged per chunk and the short send refunded."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from mesh.core.concurrency import SlotReason
from mesh.errors import ConfigError
from mesh.node import Mesh
from ratemesh.errors import ConfigError as PolicyError
from ratemesh.policyfile import parse_policy_list

C = 4


def _node(*extra: dict[str, Any], mode: str = "local") -> Mesh:
    inflight = {
        "tenant_id": "acme",
        "metric": "origin_loads",
        "generation": 1,
        "mode": mode,
        "concurrency": C,
    }
    return Mesh(
        {
            "member_id": "a",
            "policies": {"inline": [inflight, *extra]},
            "shutdown_drain_ms": 200,
        }
    ).start()


def _egress(burst: int) -> dict[str, Any]:
    """A local byte limit on client_egress_bytes with `burst` bytes and a slow refill."""
    return {
        "tenant_id": "acme",
        "metric": "client_egress_bytes",
        "generation": 1,
        "mode": "local",
        "target_rate": 1,
        "global_burst": burst,
        "local_burst_cap": burst,
    }


def test_threads_never_hold_more_than_c_and_every_slot_comes_back() -> None:
    mesh = _node()
    try:
        held, most = [0], [0]
        lock = threading.Lock()
        start = threading.Barrier(12)

        def worker() -> None:
            start.wait()
            for _ in range(200):
                with mesh.slot("acme", "origin_loads") as v:
                    if v.allowed:
                        with lock:
                            held[0] += 1
                            most[0] = max(most[0], held[0])
                        with lock:
                            held[0] -= 1

        threads = [threading.Thread(target=worker) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 1 <= most[0] <= C
        verdicts = [mesh.acquire_slot("acme", "origin_loads") for _ in range(C + 1)]
        assert [v.allowed for v in verdicts] == [True] * C + [False]
        assert verdicts[-1].reason is SlotReason.AT_CAP and verdicts[-1].bound == "in_flight<=N*C"
        assert all(mesh.release_slot(v.lease) for v in verdicts[:C])
        assert not mesh.release_slot(verdicts[0].lease)  # twice: not held
    finally:
        mesh.stop()


def test_a_ttl_slot_frees_itself_and_an_origin_loader_waits_for_one() -> None:
    mesh = _node()
    try:
        for _ in range(C):
            assert mesh.acquire_slot("acme", "origin_loads", ttl_ms=50).allowed
        with mesh.slot("acme", "origin_loads") as v:
            assert not v.allowed  # all held, no wait asked
        with mesh.slot("acme", "origin_loads", timeout_s=5.0) as v:
            assert v.allowed  # the TTL'd ones ran out while it waited
    finally:
        mesh.stop()


def test_async_with_share_mode_caps_at_ceil_c_over_n() -> None:
    async def main() -> None:
        async with Mesh(
            {
                "member_id": "a",
                "policies": {
                    "inline": [
                        {
                            "tenant_id": "*",
                            "metric": "origin_loads",
                            "generation": 1,
                            "mode": "share",
                            "concurrency": 3,
                        }
                    ]
                },
            }
        ) as mesh:
            async with mesh.slot("t1", "origin_loads") as a, mesh.slot("t1", "origin_loads"):
                assert a.allowed and a.cap == 3 and a.mode == "share"
                async with mesh.slot("t2", "origin_loads") as other:
                    assert other.allowed  # each tenant has its own slots
            assert mesh.acquire_slot("t1", "origin_loads").in_flight == 1  # both came back

    asyncio.run(main())


def test_a_slot_on_a_rate_metric_is_one_line_error() -> None:
    rate = {
        "tenant_id": "acme",
        "metric": "read_iops",
        "generation": 1,
        "target_rate": 10,
        "global_burst": 10,
        "local_burst_cap": 10,
    }
    mesh = _node(rate)
    try:
        with pytest.raises(ConfigError, match="no concurrency limit"):
            mesh.acquire_slot("acme", "read_iops")
    finally:
        mesh.stop()


def test_egress_charges_per_chunk_and_refunds_the_short_send() -> None:
    mesh = _node(_egress(1000))
    try:
        with mesh.egress("acme", 900, chunk=300) as eg:
            assert eg.sent(100) is not None  # the first chunk: 300 charged
            assert eg.sent(150) is None  # inside it: no admission
            v = eg.sent(100)  # crosses: the next chunk
            assert v is not None and v.allowed and eg.charged == 600
        # the stream stopped at 350 of 900: 250 charged and not sent come back
        assert eg.refunded == 250
        with mesh.egress("acme", 650, chunk=300) as eg2:
            for _ in range(10):
                v2 = eg2.sent(65)
                assert v2 is None or v2.allowed
            assert eg2.sent_bytes == 650  # 1000 - 350 left: all of it fits
        assert eg2.refunded == 0
        with mesh.egress("acme", 10, chunk=300) as eg3:
            v = eg3.sent(10)
            assert v is not None and not v.allowed and eg3.sent_bytes == 0  # spent
    finally:
        mesh.stop()


def test_policy_file_refuses_nonsense_concurrency() -> None:
    base = {"tenant_id": "a", "metric": "inflight", "generation": 1, "concurrency": 2}
    for extra, field in (
        ({"mode": "redis"}, "mode"),
        ({"mode": "strict"}, "mode"),
        ({"target_rate": 5}, "target_rate"),
        ({"period": "day", "quota": 5}, "concurrency"),
        ({"local_burst_cap": 3}, "local_burst_cap"),
        ({"concurrency": 0}, "concurrency"),
    ):
        with pytest.raises(PolicyError) as err:
            parse_policy_list([{**base, **extra}], where="policies")
        assert err.value.field == f"policies[0].{field}", err.value
        assert "\n" not in str(err.value)
    (ok,) = parse_policy_list([base], where="policies")
    assert ok.policy.concurrency == 2 and ok.policy.to_dict()["concurrency"] == 2


def test_global_mode_on_one_node_is_granted_by_itself() -> None:
    """A one-member fleet owns every scope: its first acquire waits for the tick that
    answers its own report, in place, with no message."""
    mesh = _node(mode="global")
    try:
        first = mesh.acquire_slot("acme", "origin_loads")
        assert not first.allowed and first.reason is SlotReason.NO_ALLOWANCE, first
        assert first.bound == "in_flight<=C+N*b"
        with mesh.slot("acme", "origin_loads", timeout_s=5.0) as v:
            assert v.allowed and v.mode == "global"
    finally:
        mesh.stop()


def test_the_api_docs_in_flight_slots_and_chunked_egress_blocks_run() -> None:
    """docs/api.md, "In-flight slots and chunked egress" and "Chunked egress": their python
    blocks, run in order
    against a node with an origin-loader limit and an egress limit."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
    section = text.split("## In-flight slots and chunked egress", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    mesh = _node(_egress(1 << 20))
    loads: list[str] = []
    sent: list[bytes] = []
    body = b"x" * 300_000

    class _Sock:
        def sendall(self, data: bytes) -> None:
            sent.append(data)

    try:
        ns: dict[str, Any] = {
            "mesh": mesh,
            "load_from_origin": lambda: loads.append("loaded"),
            "serve_busy": lambda reason: loads.append(reason),
            "body": body,
            "pieces": [body[i : i + 65536] for i in range(0, len(body), 65536)][:3],
            "sock": _Sock(),
        }
        exec(blocks[0].replace("...\n", ""), ns)  # noqa: S102 - the doc's own example
        assert loads == ["loaded"]
        exec(blocks[1], ns)  # noqa: S102
        eg = ns["eg"]
        assert sum(map(len, sent)) == eg.sent_bytes == 3 * 65536
        assert eg.charged == 256 * 1024 and eg.refunded == eg.charged - eg.sent_bytes > 0
    finally:
        mesh.stop()
