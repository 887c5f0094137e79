"""`mesh sim list` and `mesh sim run` print what scripts rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.scenario import STRATEGIES

pytestmark = pytest.mark.slow  # every test runs the mesh command

KEYS = {
    "admitted",
    "ideal",
    "max_excess",
    "mean_excess",
    "bound",
    "within_bound",
    "utilisation",
    "fairness",
    "quiet_share",
    "messages_per_worker_s",
    "round_trips_per_request",
}


def mesh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_list_names_the_scenarios() -> None:
    out = mesh("sim", "list")
    assert out.returncode == 0 and "noisy-neighbour" in out.stdout and "scale" in out.stdout


def test_run_from_a_file_prints_the_contract_and_a_plot(tmp_path: Path) -> None:
    src = Path(__file__).parents[2] / "sim" / "scenarios" / "noisy-neighbour.yaml"
    data = yaml.safe_load(src.read_text())
    data["duration_s"] = 0.5
    f = tmp_path / "nn.yaml"
    f.write_text(yaml.safe_dump(data))
    png = tmp_path / "nn.png"
    out = mesh("sim", "run", "--scenario-file", str(f), "--seed", "4", "--json", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["scenario"] == "noisy-neighbour" and result["seed"] == 4
    assert set(result["strategies"]) == set(STRATEGIES)
    for s in result["strategies"].values():
        assert KEYS <= set(s)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_a_typo_in_a_scenario_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "typo.yaml"
    f.write_text(
        "name: t\nduration_s: 1\nfleet: {workers: 2, lb_skw: 1}\n"
        "policy: {rate: 1, burst: 1, local_burst_cap: 1}\n"
        "tenants: [{name: a, offered: 1}]\n"
    )
    out = mesh("sim", "run", "--scenario-file", str(f))
    assert out.returncode == 2 and "fleet.lb_skw" in out.stderr
