"""The per-limit families the alert rules read (docs/telemetry.md), scraped from real nodes'
/metrics over HTTP: each limit's R and B as gauges, the units admitted per limit on each
member, and the owner's applied units, which sum to the same."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from mesh.core.policy import Metric, RateKey
from mesh.node import Mesh
from mesh.telemetry import OTHER
from tests.mesh._util import POLICY, http_get, static_nodes, wait_for
from tests.mesh.node.test_telemetry_labels import run as run_async

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

UNITS = "ratemesh_admitted_units_total"
APPLIED = "ratemesh_owner_applied_total"
# The fleet of the over-admission the alerts are for: R = 50/s, B = 10, b = 2.
FIFTY = dict(POLICY, target_rate=50, global_burst=10, local_burst_cap=2)
SLOW = dict(POLICY, tenant_id="slow", target_rate="1/minute", global_burst=5, local_burst_cap=2)
LOCAL = dict(POLICY, tenant_id="*", metric="write_iops", mode="local", target_rate=100)
LOCAL.update(global_burst=30)
BYTES = dict(POLICY, tenant_id="cdn", metric="client_egress_bytes", target_rate=10_000)
BYTES.update(global_burst=10_000, local_burst_cap=5_000)


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every series carrying `labels` (over tenants, say)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def scrape_async(mesh: Mesh) -> Samples:
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(f"http://{mesh.telemetry_address}/metrics")
        r.raise_for_status()
        return parse(r.text)


def test_each_limit_exports_its_rate_and_burst_exactly_for_a_sub_unit_rate() -> None:
    async def body(mesh: Mesh) -> None:
        mesh.try_admit("zed", "write_iops")  # a tenant under the default policy, ranked
        s = await scrape_async(mesh)
        rate, burst = "ratemesh_limit_rate", "ratemesh_limit_burst"
        assert value(s, rate, tenant="acme", metric="read_iops") == 50
        assert value(s, burst, tenant="acme", metric="read_iops") == 10
        assert value(s, rate, tenant="slow", metric="read_iops") == 1 / 60  # "1/minute"
        assert value(s, burst, tenant="slow", metric="read_iops") == 5
        assert value(s, rate, tenant="zed", metric="write_iops") == 100  # resolved from "*"
        assert value(s, burst, tenant="zed", metric="write_iops") == 30
        # tenant="other" stands for every tenant the default applies to
        assert value(s, rate, tenant=OTHER, metric="write_iops") == 100

    cfg = {
        "member_id": "a",
        "telemetry_listen": "127.0.0.1:0",
        "policies": {"inline": [FIFTY, SLOW, LOCAL]},
    }
    run_async(cfg, body)


def test_folded_tenants_limits_are_the_largest_among_them() -> None:
    async def body(mesh: Mesh) -> None:
        for _ in range(200):  # t1 is denied most: the one tenant with series of its own
            mesh.try_admit("t1", "read_iops")
        s = await scrape_async(mesh)
        rates = {dict(ls)["tenant"]: v for (n, ls), v in s.items() if n == "ratemesh_limit_rate"}
        assert rates == {"t1": 10, OTHER: 30}  # t2 (20) and t3 (30) folded: the largest
        assert value(s, "ratemesh_limit_burst", tenant=OTHER, metric="read_iops") == 300

    limits = [
        dict(POLICY, tenant_id=f"t{i}", target_rate=10 * i, global_burst=100 * i) for i in (1, 2, 3)
    ]
    cfg = {
        "member_id": "a",
        "telemetry_top_k": 1,
        "telemetry_listen": "127.0.0.1:0",
        "policies": {"inline": limits},
    }
    run_async(cfg, body)


def test_units_admitted_per_limit_sum_to_the_owners_applied_units() -> None:
    """Two members over gRPC admit a global limit and a local one: each member's admitted
    units per limit are its allowed decisions times their amounts, and over the members
    they equal what the owner applied. Then, with the labels settled, one member's own
    series moves by exactly what it admits next."""
    policies = [dict(FIFTY, target_rate=1000, global_burst=100, local_burst_cap=20), LOCAL]
    cfgs = static_nodes(["a", "b"], policies, telemetry_listen="127.0.0.1:0")
    a, b = Mesh(cfgs[0]).start(), Mesh(cfgs[1]).start()
    nodes = {"a": a, "b": b}
    allowed = {(m, mode): 0 for m in nodes for mode in ("global", "local")}
    lock = threading.Lock()

    def admit(m: str, rounds: int) -> None:
        for i in range(rounds):
            n = 1 + i % 3
            g = nodes[m].try_admit("acme", "read_iops", n).allowed
            loc = nodes[m].try_admit("zed", "write_iops").allowed
            with lock:
                allowed[(m, "global")] += n if g else 0
                allowed[(m, "local")] += 1 if loc else 0

    def scrape(m: str) -> Samples:
        return parse(http_get(nodes[m].telemetry_address, "/metrics").text)

    def counted() -> bool:
        s = {m: scrape(m) for m in nodes}
        ok = all(
            total(s[m], UNITS, metric=metric, mode=mode) == allowed[(m, mode)]
            for m in nodes
            for metric, mode in (("read_iops", "global"), ("write_iops", "local"))
        )
        applied = sum(total(s[m], APPLIED, metric="read_iops") for m in nodes)
        return ok and applied == allowed[("a", "global")] + allowed[("b", "global")]

    try:
        wait_for(lambda: len(a.ring) == 2 and len(b.ring) == 2, 2, "both rings complete")
        threads = [threading.Thread(target=admit, args=(m, 400)) for m in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert allowed[("a", "global")] and allowed[("b", "global")]
        wait_for(counted, 5, "units counted on both members and applied by the owner")
        before = scrape("a")  # acme and zed now have series of their own on a
        start = dict(allowed)
        admit("a", 50)
        wait_for(counted, 5, "the second round counted")
        after = scrape("a")
        for tenant, metric, mode in (
            ("acme", "read_iops", "global"),
            ("zed", "write_iops", "local"),
        ):
            moved = (value(after, UNITS, tenant=tenant, metric=metric, mode=mode) or 0) - (
                value(before, UNITS, tenant=tenant, metric=metric, mode=mode) or 0
            )
            assert moved == allowed[("a", mode)] - start[("a", mode)], (tenant, mode)
        owner = a if a.ring.owner_of(RateKey("acme", Metric.READ_IOPS, 1)) == "a" else b
        assert value(scrape(owner.member_id), APPLIED, tenant="acme", metric="read_iops")
    finally:
        a.stop()
        b.stop()


def test_a_refund_lowers_the_net_and_the_counters_never_go_down() -> None:
    """Bytes charged and given back (a short send): the worker's admitted units and the
    owner's applied units both keep the highest net reached, and count again past it."""

    async def body(mesh: Mesh) -> None:
        owner = mesh._require().member.owner

        async def units() -> float:
            return total(await scrape_async(mesh), UNITS, metric="client_egress_bytes")

        async def applied() -> float:
            return total(await scrape_async(mesh), APPLIED, metric="client_egress_bytes")

        assert mesh.try_admit("cdn", "client_egress_bytes", 100).allowed
        await until_async(units, 100)
        await until_async(applied, 100)
        mesh.refund("cdn", "client_egress_bytes", 40)  # a short send
        await until_async(lambda: _value(owner.applied_units), 60)  # the refund applied
        assert (await units(), await applied()) == (100, 100)  # the net, 60, is lower
        assert mesh.try_admit("cdn", "client_egress_bytes", 50).allowed
        await until_async(units, 110)  # counted again once past it: net 110
        await until_async(applied, 110)

    cfg = {"member_id": "a", "telemetry_listen": "127.0.0.1:0", "policies": {"inline": [BYTES]}}
    run_async(cfg, body)


async def _value(n: int) -> float:
    return n


async def until_async(read: Callable[[], Awaitable[float]], want: float) -> None:
    """Wait (bounded) until `read()` (a scrape) gives `want`."""
    got: list[float] = []

    async def check() -> bool:
        got.append(await read())
        return got[-1] == want

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3
    while not await check():
        assert loop.time() < deadline, f"waited for {want}, last read {got[-1]}"
        await asyncio.sleep(0.01)
