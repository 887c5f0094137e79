"""Static checks of governord's code, run with the suite: mypy --strict and ruff."""

from __future__ import annotations

import subprocess
import sys

import pytest

TARGETS = ["governor", "tests/governor", "bench/governor_fuzz.py"]


@pytest.mark.parametrize(
    "tool, args",
    [
        ("mypy", ["mypy", "governor"]),
        ("ruff", ["ruff", "check", *TARGETS]),
        ("ruff format", ["ruff", "format", "--check", *TARGETS]),
    ],
)
def test_static_checks(tool: str, args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{tool} found problems:\n{out.stdout}\n{out.stderr}"
