"""Shadow posture on a running node: a shadow tenant and an enforcing twin tenant with the
same limit take the same traffic; the shadow one is admitted every time, its verdicts are
the twin's `shadowed`, and /health, /metrics and the sidecar's JSON count exactly the
twin's denials (docs/policies.md, "Shadow posture")."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.core.verdict import shadowed
from mesh.node import Mesh
from mesh.peer import MemoryNetwork, MemoryTransport
from mesh.sidecar import verdict_fields
from tests.mesh._util import POLICY

SEEDS = [int(os.environ["RATEMESH_SHADOW_SEED"])] if "RATEMESH_SHADOW_SEED" in os.environ else [7]


def _config(mode: str) -> dict[str, Any]:
    limit = dict(POLICY, mode=mode, target_rate=400, global_burst=15, local_burst_cap=5)
    return {
        "member_id": "a",
        "policies": {
            "inline": [
                dict(limit, tenant_id="shadow", posture="shadow"),
                dict(limit, tenant_id="twin"),
            ]
        },
    }


def _would_deny(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["tenant"], s.labels["reason"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "ratemesh_shadow_would_deny_total"
    }


@pytest.mark.parametrize("mode", ["local", "share"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_shadow_tenant_counts_what_its_enforcing_twin_denies(mode: str, seed: int) -> None:
    rng = random.Random(seed)

    async def main() -> None:
        async with Mesh(
            _config(mode),
            transport=lambda mid, epoch, h: MemoryTransport(MemoryNetwork(), mid, h.deliver),
        ) as mesh:
            denied: dict[str, int] = {}
            calls = 0
            for tenant in ("shadow", "twin"):
                assert mesh.try_admit(tenant, "read_iops")
            mesh._require().telemetry.render()  # both tenants labelled from here on
            for rnd in range(40):
                for _ in range(rng.randint(0, 12)):
                    amount = rng.choice([1, 1, 1, 3, 20])
                    got = mesh.try_admit("shadow", "read_iops", amount)
                    want = mesh.try_admit("twin", "read_iops", amount)
                    calls += 1
                    where = f"seed {seed} mode {mode} round {rnd} (RATEMESH_SHADOW_SEED)"
                    assert got.allowed, where
                    assert got is shadowed(want), f"{where}: {got} against {want}"
                    if not want.allowed:
                        denied[want.reason.value] = denied.get(want.reason.value, 0) + 1
                await asyncio.sleep(rng.choice([0, 0.002, 0.01]))
            assert sum(denied.values()) > 0, f"seed {seed}: the traffic never reached the limit"
            health = mesh.health()
            entry = next(e for e in health["limits"] if e["tenant"] == "shadow")
            assert entry["posture"] == "shadow"
            assert entry["would_deny"]["calls"] == sum(denied.values())
            assert "posture" not in next(e for e in health["limits"] if e["tenant"] == "twin")
            assert health["shadow"]["total"]["calls"] == sum(denied.values())
            rows = {r["reason"]: r["calls"] for r in health["shadow"]["would_deny"]}
            assert rows == denied
            text = mesh._require().telemetry.render().decode()
            assert _would_deny(text) == {("shadow", r): float(n) for r, n in denied.items()}
            # the sidecar's JSON body
            v = mesh.try_admit_detailed("shadow", "read_iops", 10_000)
            body = verdict_fields(v)
            assert body["allowed"] is True and body["shadow"] is True
            assert body["would_deny_reason"] == "too_large"

    asyncio.run(main())
