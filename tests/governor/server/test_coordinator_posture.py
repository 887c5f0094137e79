"""Shadow posture through governord: `mesh policy apply` and the bootstrap file store it, a
node fed by governord meters the limit in shadow, and it is still shadow after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.node import Mesh
from tests.governor.server.test_coordinator import (
    POLICY,
    WORKER_KEY,
    _retried,
    _until,
    apply_json,
    client,
    coordinator_section,
    mesh_policy,
    running,
)

TIGHT: dict[str, Any] = dict(POLICY, target_rate=1, global_burst=3, local_burst_cap=3, mode="local")
CALLS = 12  # past the burst of 3 at 1 unit/s: most would be denied enforcing


def _postures(snap: Any) -> dict[str, str]:
    return {p.tenant_id: p.posture.value for p in snap.policies}


@pytest.mark.slow
def test_a_shadow_policy_pushed_to_governord_is_shadow_on_the_node_and_after_a_restart(
    tmp_path: Path,
) -> None:
    boot = tmp_path / "boot.yaml"
    boot.write_text(
        yaml.safe_dump(
            {"posture": "shadow", "policies": [dict(TIGHT, tenant_id="boot", generation=3)]}
        )
    )
    pushed = tmp_path / "acme.yaml"
    pushed.write_text(yaml.safe_dump({"posture": "shadow", "policies": [TIGHT]}))
    (tmp_path / "worker.key").write_text(WORKER_KEY + "\n")
    with running("sqlite", tmp_path, coordinator=coordinator_section(boot)) as d:
        out = apply_json(d, pushed)
        assert [c["policy"]["posture"] for c in out["added"]] == ["shadow"], out

        async def on_a_node() -> None:
            coord = {"addr": d.addr, "api_key_file": str(tmp_path / "worker.key")}
            cfg = {"member_id": "a", "policies": {"coordinator": {**coord, "poll_ttl_ms": 100}}}
            async with Mesh(cfg) as node:
                for tenant in ("acme", "boot"):
                    await _until(lambda t=tenant: node.try_admit(t, "read_iops").allowed, tenant)
                    verdicts = [
                        node.try_admit_detailed(tenant, "read_iops").to_dict() for _ in range(CALLS)
                    ]
                    assert all(v["allowed"] and v["shadow"] for v in verdicts), verdicts
                    would_deny = [v for v in verdicts if v["would_deny_reason"] is not None]
                    assert len(would_deny) >= CALLS - 4, verdicts  # the burst, then denials
                    assert {v["would_deny_reason"] for v in would_deny} == {"rate_limited"}
                entries = {e["tenant"]: e for e in node.health()["limits"]}
                assert entries["acme"]["posture"] == entries["boot"]["posture"] == "shadow"
                assert node.health()["policies"]["coordinator"]["conflicts"] == 0

        asyncio.run(on_a_node())
        d.stop()
        d.start()

        async def after() -> None:
            c = client(d, WORKER_KEY)
            try:
                snap = await _retried(c.list)
                assert _postures(snap) == {"acme": "shadow", "boot": "shadow"}
            finally:
                await c.close()

        asyncio.run(after())
        # the same file enforcing: the diff names the posture, and the push is a new generation
        pushed.write_text(yaml.safe_dump({"policies": [TIGHT]}))
        dry = mesh_policy(d, "apply", "-f", str(pushed), "--dry-run")
        assert dry.returncode == 0 and "posture shadow -> enforce" in dry.stdout, dry
        out = apply_json(d, pushed)
        assert [(c["generation"], c["changes"]) for c in out["changed"]] == [
            (2, {"posture": ["shadow", "enforce"]})
        ], out
