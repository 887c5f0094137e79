"""The public surface: `mesh.__all__` is pinned, and the commands print their contracts."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

import mesh

PUBLIC = [
    "Admission",
    "Charge",
    "ConfigError",
    "ConfigTypeError",
    "CoreConfig",
    "Limited",
    "Mesh",
    "MeshError",
    "Metric",
    "Mode",
    "PolicyCache",
    "RateLimited",
    "Reason",
    "Step",
    "Suspension",
    "TenantRatePolicy",
    "Unit",
    "Verdict",
    "admit",
    "descriptor_tenant",
    "limited",
]

# The parts inside the mesh, reachable by their modules and not promised by `mesh`.
INTERNAL = {
    "Gcra": "mesh.core.gcra",
    "MessageError": "mesh.errors",
    "Owner": "mesh.core.owner",
    "RateKey": "mesh.core.policy",
    "RateSnapshot": "mesh.core.messages",
    "ReportBatch": "mesh.core.messages",
    "Reporter": "mesh.core.reporter",
    "Ring": "mesh.core.ring",
    "SnapshotBatch": "mesh.core.messages",
    "Ticker": "mesh.aio",
    "UsageReport": "mesh.core.messages",
}


def test_public_api_is_pinned() -> None:
    assert sorted(mesh.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(mesh, name), name
    from mesh.node import Mesh

    assert mesh.Mesh is Mesh


def test_the_internals_stay_in_their_modules() -> None:
    import importlib

    for name, module in INTERNAL.items():
        assert not hasattr(mesh, name), f"mesh.{name} is not the embedding API"
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_every_public_name_is_documented() -> None:
    from pathlib import Path

    api = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    missing = [name for name in PUBLIC if f"`mesh.{name}" not in api]
    assert not missing, f"docs/api.md does not describe: {missing}"


@pytest.mark.slow
def test_importing_the_cores_does_not_load_grpc() -> None:
    code = "import mesh, mesh.core.admission, sys; assert 'grpc' not in sys.modules, 'grpc loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def run(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_demo_prints_the_tenants_beside_the_ideal_and_the_bound() -> None:
    result = run("demo", "--memory", "--seconds", "1", "--json")
    for t in ("noisy", "quiet"):
        row = result["tenants"][t]
        assert row["within_bound"] is True
        assert row["admitted"] <= row["ideal"] + row["bound"]
    assert result["tenants"]["quiet"]["utilisation"] >= 0.97


@pytest.mark.slow
def test_bench_hotpath_prints_the_contract_keys() -> None:
    result = run("bench", "hotpath", "--ops", "20000", "--keys", "500", "--json")
    for key in ("mesh.hot_key", "mesh.many_keys", "limits.hot_key", "limits.many_keys"):
        assert set(result[key]) >= {"ops_per_s", "p50_ns", "p99_ns"}
    assert {"ratio_hot", "ratio_many", "bytes_per_key"} <= set(result)


@pytest.mark.slow
def test_bad_arguments_are_refused_with_a_message() -> None:
    for mode in ("--memory", "--loopback"):
        out = subprocess.run(
            [sys.executable, "-m", "mesh.cli", "demo", mode, "--seconds", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and "--seconds" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "demo", "--memory", "--loopback"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "exclude" in out.stderr


def test_the_readme_core_example_runs() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "README.md").read_text()
    section = text[text.index("## Using the mesh core") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    exec(compile(match.group(1), "README.md", "exec"), {})
