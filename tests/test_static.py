"""The repository's one static check: ruff (lint and format), mypy strict over every package
and the tests, and import-linter's contracts (the sans-I/O cores, the layers, no cycles)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PACKAGES = ["ratemesh", "mesh", "governor", "sim", "bench", "tests"]

CHECKS = {
    "ruff-lint": [sys.executable, "-m", "ruff", "check", "."],
    "ruff-format": [sys.executable, "-m", "ruff", "format", "--check", "."],
    "mypy": [sys.executable, "-m", "mypy", *PACKAGES],  # strict by pyproject.toml
    "lint-imports": [str(BIN / "lint-imports")],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_static(name: str) -> None:
    out = subprocess.run(CHECKS[name], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{name} found problems:\n{out.stdout}\n{out.stderr}"
