"""Static checks for the node's tests (the mesh package itself is checked in tests/test_lint),
and the shipped example config validates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_on_node_tests_and_benches() -> None:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "tests/node", "bench/owner.py",
                          "bench/cluster.py", "bench/_procs.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_deploy_example_config_validates() -> None:
    out = subprocess.run([sys.executable, "-m", "mesh.cli", "validate", "--config",
                          str(ROOT / "deploy" / "mesh-node.yaml"), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
