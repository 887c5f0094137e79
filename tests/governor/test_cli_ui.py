"""`governord ui` never sits on "connecting...": without a governord named, with no key, with
a URL for an address or with nothing answering, it is one line and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.governor._daemon import free_port

pytestmark = pytest.mark.slow


def _ui(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_")}
    return subprocess.run(
        [sys.executable, "-m", "governor.cli", "ui"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("env", "status", "names"),
    [
        ({}, 2, "GOVERNOR_ADDR"),
        ({"GOVERNOR_ADDR": "127.0.0.1:7443"}, 2, "GOVERNOR_API_KEY"),
        ({"GOVERNOR_ADDR": "http://127.0.0.1:7443", "GOVERNOR_API_KEY": "k"}, 2, "is a URL"),
        ({"GOVERNOR_ADDR": "127.0.0.1:{port}", "GOVERNOR_API_KEY": "k"}, 69, "does not answer"),
    ],
)
def test_ui_says_what_is_missing_in_one_line(env: dict[str, str], status: int, names: str) -> None:
    port = str(free_port())
    out = _ui(**{k: v.format(port=port) for k, v in env.items()})
    assert out.returncode == status, out
    (line,) = out.stderr.splitlines()
    assert names in line and "Traceback" not in line, line
