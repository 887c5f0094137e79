"""A node's policy file reloads without a restart: by the API, by the file watch
and by SIGHUP to a real `mesh node`. New generations are learned; a bad file or a known
generation with a new meaning is refused, counted, and changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench._procs import read_ready, spawn, stop
from mesh.errors import ConfigError
from mesh.node import Mesh
from mesh.peer import MemoryNetwork, MemoryTransport
from tests.mesh._util import POLICY, http_get, static_nodes, until, wait_for


def _write(path: Path, *policies: dict[str, Any]) -> None:
    """Replace the file in one step (as an editor or a config map does)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"policies": list(policies)}))
    os.replace(tmp, path)


def _memory(cfg: dict[str, Any]) -> Mesh:
    return Mesh(
        cfg, transport=lambda mid, epoch, h: MemoryTransport(MemoryNetwork(), mid, h.deliver)
    )


def _enforced(mesh: Mesh) -> dict[tuple[str, str], int]:
    return {
        (e["tenant"], e["metric"]): e["generation"] for e in mesh.health()["policies"]["enforced"]
    }


def _metrics(mesh: Mesh) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = mesh._require().telemetry.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_reload_learns_new_generations_and_refuses_bad_files_changing_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policies.yaml"
    _write(path, POLICY)
    cfg = {"member_id": "a", "policies": {"file": str(path), "watch_ms": 0}}

    async def main() -> None:
        async with _memory(cfg) as mesh:
            assert _enforced(mesh) == {("acme", "read_iops"): 1}
            other = dict(POLICY, tenant_id="beta")
            _write(path, POLICY, dict(POLICY, generation=2, target_rate=500), other)
            assert mesh.reload_policies() is True
            assert _enforced(mesh) == {("acme", "read_iops"): 2, ("beta", "read_iops"): 1}
            await until(
                lambda: mesh.health()["limits"][0]["target_rate"] == 500, 2, "admission adopted"
            )
            before = mesh.health()["limits"]

            bad_files = {
                "invalid": "policies: [{tenant_id: acme, metric: read_iops, generation: 3",
                "conflict": yaml.safe_dump([dict(POLICY, generation=2, target_rate=7)]),
            }
            for reason, text in bad_files.items():
                path.write_text(text)
                assert mesh.reload_policies() is False
                reload = mesh.health()["policies"]["reload"]
                assert reload["refused"][reason] == 1, reload
                assert reload["last_error"].startswith("policies.file")
                assert "\n" not in reload["last_error"]
                assert mesh.health()["limits"] == before  # nothing changed
            assert "already known with different values" in reload["last_error"]

            _write(path, POLICY, dict(POLICY, generation=3, target_rate=250))
            assert mesh.reload_policies("api") is True
            assert _enforced(mesh)[("acme", "read_iops")] == 3
            # a limit taken out of the file stays enforced (a reload never forgets)
            assert _enforced(mesh)[("beta", "read_iops")] == 1
            reload = mesh.health()["policies"]["reload"]
            assert (reload["ok"], reload["learned"], reload["last_error"]) == (2, 2, None)

            m = _metrics(mesh)
            assert m[("ratemesh_policy_reloads_total", ())] == 2
            for reason in ("invalid", "conflict"):
                assert m[("ratemesh_policy_reloads_refused_total", (("reason", reason),))] == 1
            gen = "ratemesh_policy_generation"
            assert m[(gen, (("metric", "read_iops"), ("tenant", "acme")))] == 3
            assert m[(gen, (("metric", "read_iops"), ("tenant", "beta")))] == 1

    asyncio.run(main())


def test_the_file_watch_reloads_an_edit_once_and_a_refused_edit_once(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    _write(path, POLICY)
    cfg = {"member_id": "a", "policies": {"file": str(path), "watch_ms": 20}}

    async def main() -> None:
        async with _memory(cfg) as mesh:

            def reload() -> dict[str, Any]:
                r = mesh.health()["policies"]["reload"]
                assert isinstance(r, dict)
                return r

            _write(path, POLICY, dict(POLICY, generation=2))
            await until(lambda: _enforced(mesh)[("acme", "read_iops")] == 2, 3, "watched")
            assert reload()["ok"] == 1 and reload()["last_trigger"] == "watch"
            path.write_text("[not: valid")
            await until(lambda: reload()["refused"]["invalid"] == 1, 3, "refused")
            await asyncio.sleep(0.2)  # ten more polls: the same bad bytes are not retried
            assert reload()["refused"]["invalid"] == 1
            _write(path, POLICY, dict(POLICY, generation=2))  # the good content again
            await until(lambda: reload()["ok"] == 2, 3, "fixed")
            os.utime(path)  # touched, same bytes: nothing to reload
            await asyncio.sleep(0.2)
            assert reload()["ok"] == 2
            assert _enforced(mesh)[("acme", "read_iops")] == 2

    asyncio.run(main())


def test_reload_without_a_policy_file_names_the_setting() -> None:
    async def main() -> None:
        async with _memory({"member_id": "a", "policies": {"inline": [POLICY]}}) as mesh:
            with pytest.raises(ConfigError, match="policies.file"):
                mesh.reload_policies()
            assert mesh.health()["policies"]["reload"] is None

    asyncio.run(main())


@pytest.mark.slow
def test_sighup_reloads_a_real_node_which_keeps_serving(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    _write(path, POLICY)
    (cfg,) = static_nodes(["solo"], telemetry_listen="127.0.0.1:0")
    cfg["policies"] = {"file": str(path), "watch_ms": 0}  # SIGHUP only
    cfg_path = tmp_path / "node.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = spawn(["-m", "mesh.cli", "node", "--config", str(cfg_path), "--log-level", "INFO"])
    try:
        ready = read_ready(proc)

        def health() -> dict[str, Any]:
            out = json.loads(http_get(ready["telemetry"], "/health").text)
            assert isinstance(out, dict)
            return out

        _write(path, POLICY, dict(POLICY, generation=2))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: health()["policies"]["reload"]["ok"] == 1, 10, "reloaded")
        assert health()["policies"]["enforced"] == [
            {"tenant": "acme", "metric": "read_iops", "generation": 2}
        ]
        path.write_text("policies: 3\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: health()["policies"]["reload"]["refused"]["invalid"] == 1, 10, "refused")
        assert proc.poll() is None  # SIGHUP never ends the node
        text = http_get(ready["telemetry"], "/metrics").text
        assert 'ratemesh_policy_generation{metric="read_iops",tenant="acme"} 2.0' in text
        assert 'ratemesh_policy_reloads_refused_total{reason="invalid"} 1.0' in text
        proc.terminate()
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
        refusals = [line for line in err.splitlines() if "refused" in line]
        assert len(refusals) == 1 and "policies.file" in refusals[0], err[-2000:]
    finally:
        stop(proc)


def test_the_generation_gauge_labels_at_most_top_k_tenants_and_other() -> None:
    policies = [dict(POLICY, tenant_id=f"t{i}", generation=i + 1) for i in range(10)]
    cfg = {"member_id": "a", "telemetry_top_k": 3, "policies": {"inline": policies}}

    async def main() -> None:
        async with _memory(cfg) as mesh:
            gens = {
                dict(labels)["tenant"]: v
                for (name, labels), v in _metrics(mesh).items()
                if name == "ratemesh_policy_generation"
            }
            # idle tenants fill the free slots by name; the rest show their highest
            assert gens == {"t0": 1, "t1": 2, "t2": 3, "other": 10}
            assert len(_enforced(mesh)) == 10  # /health lists every limit

    asyncio.run(main())


@pytest.mark.slow
def test_sighup_to_a_node_without_a_policy_file_is_logged_and_ignored(tmp_path: Path) -> None:
    (cfg,) = static_nodes(["solo"])
    cfg_path = tmp_path / "node.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = spawn(["-m", "mesh.cli", "node", "--config", str(cfg_path)])
    try:
        read_ready(proc)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)  # let the loop handle it before SIGTERM (signals may coalesce)
        assert proc.poll() is None  # still serving
        proc.terminate()
        assert proc.wait(10) == 0  # a graceful leave, not the signal's default
        assert proc.stderr is not None
        lines = [ln for ln in proc.stderr.read().splitlines() if "SIGHUP" in ln]
        assert len(lines) == 1 and "policies.file" in lines[0], lines
    finally:
        stop(proc)


def test_a_threaded_node_reloads_from_the_app_thread(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    _write(path, POLICY)
    mesh = _memory({"member_id": "a", "policies": {"file": str(path), "watch_ms": 0}}).start()
    try:
        _write(path, POLICY, dict(POLICY, generation=2))
        assert mesh.reload_policies() is True
        assert _enforced(mesh) == {("acme", "read_iops"): 2}
        wait_for(lambda: mesh.try_admit("acme", "read_iops").allowed, 2, "admits under gen 2")
    finally:
        mesh.stop()


def test_an_accepted_reload_is_declared_to_the_coordinator(tmp_path: Path) -> None:
    """governord refuses a push that would give a node's own generation other values only
    if it knows them: the generations a reload loads are declared at the next watch."""
    from mesh.core.policy import PolicyCache, TenantRatePolicy
    from mesh.node._mesh import _declare_to
    from mesh.node._reload import PolicyReloader
    from mesh.peer import CoordinatorClient

    first = TenantRatePolicy.from_dict(dict(POLICY, generation=1))
    path = tmp_path / "policies.yaml"

    async def main() -> None:  # the client's channel lives on a loop
        client = CoordinatorClient("127.0.0.1:1", declared=(first,))
        try:
            _write(path, dict(POLICY, generation=2))
            reloader = PolicyReloader(
                str(path), PolicyCache([first]), watch_ms=0, on_loaded=_declare_to(client)
            )
            assert reloader.reload("api")
            assert sorted(p.generation for p in client.declared) == [1, 2]
            _write(path, dict(POLICY, generation=2, target_rate=1))  # a conflict: refused
            assert not reloader.reload("api")
            assert sorted(p.generation for p in client.declared) == [1, 2]
        finally:
            await client.close()

    asyncio.run(main())
    assert _declare_to(None) is None
