"""Static checks run with the suite: mypy --strict and ruff on the mesh and its tests."""

from __future__ import annotations

import subprocess
import sys

import pytest

TARGETS = ["mesh", "bench", "sim", "tests/mesh", "tests/sim"]


@pytest.mark.parametrize("tool, args", [
    ("mypy", ["mypy", "mesh", "bench", "sim"]),
    ("ruff", ["ruff", "check", *TARGETS]),
])
def test_static_checks(tool: str, args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, f"{tool} found problems:\n{out.stdout}\n{out.stderr}"
