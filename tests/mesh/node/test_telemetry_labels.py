"""Bounded telemetry (part 5): per-tenant series for the top-K tenants only, the
rest under tenant="other"; unknown tenants never a label value; counters monotonic per label
while the labelled set changes; idle tenants' decision counts forgotten."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.node import Mesh
from mesh.peer import MemoryNetwork, MemoryTransport
from mesh.telemetry import OTHER
from tests.mesh._util import POLICY


def run(cfg: dict[str, Any], body: Callable[[Mesh], Awaitable[None]]) -> None:
    async def main() -> None:
        async with Mesh(
            cfg, transport=lambda mid, epoch, h: MemoryTransport(MemoryNetwork(), mid, h.deliver)
        ) as mesh:
            await body(mesh)

    asyncio.run(main())


def config(top_k: int, *policies: dict[str, Any]) -> dict[str, Any]:
    return {"member_id": "a", "telemetry_top_k": top_k, "policies": {"inline": list(policies)}}


def scrape(mesh: Mesh) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    text = mesh._require().telemetry.render().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.endswith("_total")
    }
    return text, samples


def tenants_in(text: str) -> set[str]:
    return {
        s.labels["tenant"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "tenant" in s.labels
    }


DECISIONS = {"ratemesh_admitted_total", "ratemesh_denied_total"}


def decided(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    """The decisions counted, over every label."""
    return sum(v for (n, _), v in samples.items() if n in DECISIONS)


LOCAL = dict(POLICY, tenant_id="*", mode="local", target_rate=1000, global_burst=10)


def test_only_the_top_k_tenants_by_denials_get_series_and_the_rest_are_other() -> None:
    async def body(mesh: Mesh) -> None:
        for i in range(200):  # tenant i is denied i times (its burst is 10)
            for _ in range(10 + i % 20):
                mesh.try_admit(f"t{i:03d}", "read_iops")
        text, samples = scrape(mesh)
        labels = tenants_in(text)
        assert len(labels) <= 5 + 1 and OTHER in labels
        assert labels - {OTHER} <= {f"t{i:03d}" for i in range(200) if i % 20 == 19}
        admitted = sum(v for (n, _), v in samples.items() if n == "ratemesh_admitted_total")
        denied = sum(v for (n, _), v in samples.items() if n == "ratemesh_denied_total")
        assert (admitted, denied) == (200 * 10, sum(i % 20 for i in range(200)))

    run(config(5, LOCAL), body)


def test_an_unknown_tenant_never_becomes_a_label_value() -> None:
    async def body(mesh: Mesh) -> None:
        for _ in range(50):
            assert not mesh.try_admit("mallory", "read_iops").allowed  # no policy
        mesh.try_admit("acme", "read_iops")
        text, samples = scrape(mesh)
        assert "mallory" not in text
        assert tenants_in(text) == {"acme", OTHER}
        key = (
            "ratemesh_denied_total",
            (("metric", "read_iops"), ("mode", "none"), ("reason", "policy_unknown"))
            + (("tenant", OTHER),),
        )
        assert samples[key] == 50

    run(config(50, POLICY), body)


def test_counters_stay_monotonic_per_label_while_the_top_k_changes() -> None:
    async def body(mesh: Mesh) -> None:
        seen: dict[Any, float] = {}
        sums: list[float] = []
        tel = mesh._require().telemetry
        for rnd in range(6):
            # Each round another pair of tenants is denied most; all are used a little.
            for i in range(12):
                n = 40 if i // 2 == rnd else 11
                for _ in range(n):
                    mesh.try_admit(f"t{i}", "read_iops")
            if rnd == 3:
                tel.forget_idle()  # counts so far are remembered as they are
                tel.forget_idle()  # untouched since: folded into the totals, dropped
            text, samples = scrape(mesh)
            assert len(tenants_in(text)) <= 2 + 1
            for k, v in samples.items():
                assert v >= seen.get(k, 0), (rnd, k)
            seen.update(samples)
            sums.append(sum(v for (n, _), v in samples.items() if n in DECISIONS))
        assert sums == sorted(sums)
        assert sums[-1] == 6 * (2 * 40 + 10 * 11)  # every decision counted exactly once

    run(config(2, LOCAL), body)


def test_idle_tenants_decision_counts_are_forgotten() -> None:
    async def body(mesh: Mesh) -> None:
        tel = mesh._require().telemetry
        for i in range(1000):
            mesh.try_admit(f"t{i}", "read_iops")
        _, before = scrape(mesh)
        assert len(tel.decisions) == 1000
        tel.forget_idle()
        mesh.try_admit("t1", "read_iops")  # still active
        tel.forget_idle()
        assert list(tel.decisions) == [k for k in tel.decisions if k[0] == "t1"]
        _, after = scrape(mesh)
        assert decided(after) == decided(before) + 1

    run(config(50, LOCAL), body)


def test_a_view_the_core_forgets_takes_its_decision_counts_with_it() -> None:
    """The counts go when the idle sweep forgets the view, not a period later,
    and every decision stays counted once in the exported totals."""

    async def body(mesh: Mesh) -> None:
        tel = mesh._require().telemetry
        adm = mesh._require().member.admission
        for i in range(300):
            mesh.try_admit(f"t{i}", "read_iops")
        _, before = scrape(mesh)
        assert len(tel.decisions) == 300
        for _ in range(200):  # views_idle_ms 100: a sweep pass forgets every full bucket
            await asyncio.sleep(0.005)
            if adm.gate_count == 0:
                break
        assert adm.gate_count == 0
        assert not tel.decisions
        _, after = scrape(mesh)
        assert decided(after) == decided(before) == 300
        mesh.try_admit("t1", "read_iops")  # used again: counted anew, once
        _, again = scrape(mesh)
        assert decided(again) == 301

    cfg = config(50, LOCAL)
    cfg["core"] = {"views_idle_ms": 100}
    run(cfg, body)


@pytest.mark.slow
def test_metrics_at_100000_tenants_stay_under_1_mb_with_at_most_k_plus_1_labels() -> None:
    async def body(mesh: Mesh) -> None:
        for i in range(100_000):
            mesh.try_admit(f"tenant-{i}", "read_iops")
            if i % 7 == 0:
                for _ in range(12):
                    mesh.try_admit(f"tenant-{i}", "read_iops")
        text, _ = scrape(mesh)
        assert len(text.encode()) < 1_000_000
        assert len(tenants_in(text)) <= 50 + 1

    run(config(50, LOCAL), body)
