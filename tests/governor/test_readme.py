"""docs/governord.md's governed worker runs as written, against a real governord (SQLite)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.governor._daemon import KEYS, ROOT, Daemon, running

pytestmark = pytest.mark.slow  # runs governord and the doc's worker

DOC = ROOT / "docs" / "governord.md"
SECTION = "## The daemon and the SDK"


def _example() -> str:
    text = DOC.read_text()
    assert SECTION in text
    section = text[text.index(SECTION) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


def test_the_docs_worker_is_short_and_runs(daemon: Daemon, tmp_path: Path) -> None:
    code = _example()
    assert len(code.strip().splitlines()) <= 20
    script = tmp_path / "worker.py"
    script.write_text(code)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GOVERNOR_ADDR": daemon.addr,
        "GOVERNOR_API_KEY": KEYS["KEY_A"],
    }
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "200" in out.stdout
