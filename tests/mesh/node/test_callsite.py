"""Call-site helpers: `Mesh.limited` as a decorator and a context manager, sync
and async, on a real node: admit on enter, `RateLimited` carrying the verdict when denied,
and a refund of what the block did not use (a short send); an exception refunds only when
asked. Open metric names and descriptors through the node, and bounded telemetry labels."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mesh import Charge, RateLimited, descriptor_tenant
from mesh.core.verdict import Reason
from mesh.errors import ConfigError
from mesh.node import Mesh
from mesh.peer import MemoryNetwork, MemoryTransport
from tests.mesh.node.test_telemetry_labels import scrape

BURST = 100


def pol(metric: str, **kw: Any) -> dict[str, Any]:
    return {
        "tenant_id": "acme",
        "metric": metric,
        "generation": 1,
        "target_rate": "1/second",  # nothing refills within a test
        "global_burst": BURST,
        "local_burst_cap": BURST,
        "mode": "local",
        **kw,
    }


POLICIES = [
    pol("requests"),
    pol("upload_bytes", global_burst="1KiB", local_burst_cap="1KiB"),
    pol("tokens", unit="tokens", global_burst="1k", local_burst_cap="1k"),
    pol("requests", global_burst=3, local_burst_cap=3, descriptor={"route": "/upload"}),
]


def run(body: Callable[[Mesh], Awaitable[None]]) -> None:
    async def main() -> None:
        cfg = {"member_id": "a", "policies": {"inline": POLICIES}}
        async with Mesh(
            cfg, transport=lambda mid, epoch, h: MemoryTransport(MemoryNetwork(), mid, h.deliver)
        ) as mesh:
            await body(mesh)

    asyncio.run(main())


def avail(mesh: Mesh, metric: str, tenant: str = "acme") -> int:
    gate = mesh._require().member.admission.gate(tenant, metric)
    assert gate is not None
    return gate.avail


def test_a_short_send_refunds_what_was_not_used() -> None:
    async def body(mesh: Mesh) -> None:
        with mesh.limited("acme", "upload_bytes", 512) as charge:
            assert isinstance(charge, Charge) and charge.verdict.allowed
            assert avail(mesh, "upload_bytes") == 1024 - 512
            charge.used(200)  # the send took 200 of 512
        assert avail(mesh, "upload_bytes") == 1024 - 200 and charge.refunded == 312
        with mesh.limited("acme", "upload_bytes", 300) as charge:
            charge.refund(100)  # given back at once
            assert avail(mesh, "upload_bytes") == 1024 - 200 - 200
        assert avail(mesh, "upload_bytes") == 1024 - 400  # nothing said after: all used
        with mesh.limited("acme", "upload_bytes", 100) as charge:
            charge.refund(30)
            charge.used(50)  # of the 70 left, 50 used: 20 more back at the end
        assert avail(mesh, "upload_bytes") == 1024 - 400 - 50
        with mesh.limited("acme", "upload_bytes", 10) as charge:
            with pytest.raises(ConfigError, match="more than the 10 left"):
                charge.used(11)
            with pytest.raises(ConfigError, match="must be an integer >= 0"):
                charge.refund(-1)
        with pytest.raises(ConfigError, match="block has ended"):
            charge.used(1)

    run(body)


def test_denied_raises_rate_limited_with_the_verdict_and_the_block_does_not_run() -> None:
    async def body(mesh: Mesh) -> None:
        ran = []
        with pytest.raises(RateLimited) as info:
            with mesh.limited("acme", "upload_bytes", 4096):  # above the burst: too large
                ran.append(1)
        assert not ran and info.value.verdict.reason is Reason.TOO_LARGE
        assert info.value.metric == "upload_bytes" and info.value.amount == 4096
        assert "denied (too_large" in str(info.value)
        with pytest.raises(RateLimited) as unknown:
            with mesh.limited("mallory", "requests"):
                ran.append(2)
        assert unknown.value.verdict.reason is Reason.POLICY_UNKNOWN and not ran

    run(body)


def test_an_exception_refunds_only_when_asked() -> None:
    async def body(mesh: Mesh) -> None:
        with pytest.raises(KeyError):
            with mesh.limited("acme", "tokens", 100):
                raise KeyError("the call failed")
        assert avail(mesh, "tokens") == 900  # kept: the work may have happened
        with pytest.raises(KeyError):
            with mesh.limited("acme", "tokens", 100, refund_on_error=True) as charge:
                charge.refund(10)
                raise KeyError("failed before sending")
        assert avail(mesh, "tokens") == 900 and charge.refunded == 100

    run(body)


def test_the_decorator_admits_each_call_sync_and_async() -> None:
    async def body(mesh: Mesh) -> None:
        limit = mesh.limited("acme", "requests", descriptor=("route", "/upload"))

        @limit
        def upload(n: int) -> int:
            return n * 2

        @limit
        async def upload_async(n: int) -> int:
            await asyncio.sleep(0)
            return n + 1

        assert upload.__name__ == "upload" and upload(2) == 4
        assert await upload_async(1) == 2
        assert upload(3) == 6
        with pytest.raises(RateLimited):  # the route's burst is 3
            upload(4)
        with pytest.raises(RateLimited):
            await upload_async(4)
        route = descriptor_tenant("acme", ("route", "/upload"))
        assert avail(mesh, "requests", route) == 0
        assert mesh.try_admit("acme", "requests").allowed  # the tenant's own bucket is apart

    run(body)


def test_async_with_waits_a_bounded_time_and_concurrent_blocks_keep_their_charges() -> None:
    async def body(mesh: Mesh) -> None:
        limit = mesh.limited("acme", "tokens", 100)
        used = iter([10, 20, 30, 40])

        async def call() -> None:
            async with limit as charge:
                await asyncio.sleep(0.01)  # the blocks overlap
                charge.used(next(used))

        await asyncio.gather(*(call() for _ in range(4)))
        assert avail(mesh, "tokens") == 1000 - 100
        async with mesh.limited("acme", "tokens", 200, timeout_s=0.2) as charge:
            charge.used(0)
        assert avail(mesh, "tokens") == 900
        with pytest.raises(RateLimited) as info:
            async with mesh.limited("acme", "tokens", 950, timeout_s=0.05):
                pass
        assert info.value.verdict.reason is Reason.DEADLINE_EXCEEDED

    run(body)


def test_a_threaded_node_blocks_with_timeout_s() -> None:
    cfg = {"member_id": "a", "policies": {"inline": POLICIES}}
    mesh = Mesh(
        cfg, transport=lambda mid, epoch, h: MemoryTransport(MemoryNetwork(), mid, h.deliver)
    ).start()
    try:
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                with mesh.limited("acme", "requests", 5, timeout_s=0.5) as charge:
                    charge.used(2)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert not errors
        assert mesh.try_admit("acme", "requests", BURST - 4 * 2).allowed  # 4 x 3 came back
        assert not mesh.try_admit("acme", "requests").allowed
    finally:
        mesh.stop()


def test_bad_arguments_are_config_errors_naming_the_field() -> None:
    async def body(mesh: Mesh) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"tenant": ""}, "tenant"),
            ({"metric": "Bad"}, "metric"),
            ({"amount": 0}, "amount"),
            ({"timeout_s": -1}, "timeout_s"),
            ({"descriptor": {"a": "1", "b": "2"}}, "descriptor"),
        ]
        for kwargs, field in cases:
            args: dict[str, Any] = {"tenant": "acme", "metric": "requests", **kwargs}
            with pytest.raises(ConfigError) as info:
                mesh.limited(**args)
            assert info.value.field == field

    run(body)


def test_an_undeclared_metric_never_becomes_a_label_value() -> None:
    async def body(mesh: Mesh) -> None:
        for i in range(20):
            assert not mesh.try_admit("acme", f"made_up_{i}").allowed  # valid names, no policy
        assert not mesh.try_admit("mallory", "tokens").allowed  # a declared one, no policy
        assert mesh.try_admit("acme", "tokens").allowed
        text, samples = scrape(mesh)
        assert "made_up" not in text
        unknown = {
            dict(labels)["metric"]: v
            for (name, labels), v in samples.items()
            if name == "ratemesh_denied_total" and dict(labels)["reason"] == "policy_unknown"
        }
        assert unknown == {"other": 20, "tokens": 1}

    run(body)


@pytest.mark.slow
def test_two_nodes_meter_an_open_name_and_a_descriptor_end_to_end() -> None:
    """Two real nodes over the in-memory Transport: "requests" (a rate written as text) and a
    route's own limit under the tenant, both metered by their owners within the envelope."""
    from mesh.membership import StaticMembership

    route = {"route": "/upload"}
    policies = [
        pol("requests", target_rate="60k/minute", global_burst=100, local_burst_cap=20),
        pol("requests", target_rate=200, global_burst=20, local_burst_cap=5, descriptor=route),
    ]
    policies = [{**p, "mode": "global"} for p in policies]

    async def main() -> None:
        net = MemoryNetwork()
        ids = ["a", "b"]
        meshes = [
            Mesh(
                {"member_id": m, "policies": {"inline": policies}},
                transport=lambda mid, epoch, h: MemoryTransport(net, mid, h.deliver),
                membership=StaticMembership({i: f"memory:{i}" for i in ids}),
            )
            for m in ids
        ]
        for mesh in meshes:
            await mesh.astart()
        for _ in range(200):
            if all(len(m.ring) == 2 for m in meshes):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # owners past B/R: keys start full
        plain = routed = 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while loop.time() - t0 < 1.0:  # about 4x the tenant's limit, 10x the route's
            for mesh in meshes:
                plain += sum(mesh.try_admit("acme", "requests").allowed for _ in range(2))
                try:
                    async with mesh.limited("acme", "requests", descriptor=("route", "/upload")):
                        routed += 1
                except RateLimited:
                    pass
            await asyncio.sleep(0.001)
        elapsed = loop.time() - t0
        applied = sum(m.health()["owner"]["applied_units"] for m in meshes)
        for mesh in meshes:
            await mesh.aclose()
        d_s = 0.03  # two sync intervals and the loop's own lag, generously
        assert plain <= 100 + 1000 * elapsed + 2 * 20 + 1000 * d_s, plain
        assert plain >= 0.8 * 1000 * elapsed, plain
        assert routed <= 20 + 200 * elapsed + 2 * 5 + 200 * d_s, routed
        assert routed >= 0.7 * 200 * elapsed, routed
        assert applied > 0

    asyncio.run(main())


def test_health_shows_a_descriptors_key_as_tenant_and_descriptor() -> None:
    """/health names a descriptor's own limit by its tenant and `descriptor`, never by the
    encoded tenant part."""

    async def body(mesh: Mesh) -> None:
        limits = mesh.health()["limits"]
        routed = [e for e in limits if "descriptor" in e]
        assert [(e["tenant"], e["descriptor"], e["metric"]) for e in routed] == [
            ("acme", "route=/upload", "requests")
        ]
        assert not any("\x1e" in str(e) for e in limits)

    run(body)


def test_fleet_comparison_keeps_a_descriptors_limit_apart_from_its_tenants() -> None:
    from mesh.telemetry import MemberAnswer, enforced_of, fleet_report

    async def body(mesh: Mesh) -> None:
        enforced = enforced_of({"policies": mesh.health()["policies"]})
        upload = descriptor_tenant("acme", ("route", "/upload"))
        assert (upload, "requests") in enforced and ("acme", "requests") in enforced
        report = fleet_report([MemberAnswer("a", "a:1", enforced)])
        rows = [r for r in report["limits"] if r.get("descriptor")]
        assert [(r["tenant"], r["descriptor"]) for r in rows] == [("acme", "route=/upload")]

    run(body)


def test_metrics_label_a_descriptors_key_in_the_operators_form() -> None:
    async def body(mesh: Mesh) -> None:
        upload = descriptor_tenant("acme", ("route", "/upload"))
        assert mesh.try_admit(upload, "requests").allowed
        text, samples = scrape(mesh)
        assert "\x1e" not in text
        labels = {dict(k[1]).get("tenant") for k in samples}
        assert "acme[route=/upload]" in labels

    run(body)
