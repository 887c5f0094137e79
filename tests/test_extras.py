"""The newcomer path has no tracebacks: README line 1 installs the package without extras,
and a command that needs one (matplotlib for `--plot`, limits for the hotpath bench, textual
for `governord ui`) says which in one line and exits 2 before doing any work. Each is run
here with its package hidden; every import of an extra's package in the shipped code is
listed here, so a new one is not missed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mesh.cli._extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"limits", "matplotlib", "textual", "hiredis"}  # pyproject's extras, not its deps

# file -> the command that reaches it, run with the file's package hidden
GUARDED: dict[str, tuple[str, list[str]]] = {
    "sim/plot.py": (
        "matplotlib",
        [
            "mesh",
            "sim",
            "run",
            "--scenario",
            "noisy-neighbour",
            "--duration",
            "1",
            "--plot",
            "{tmp}/x.png",
        ],
    ),
    "bench/hotpath.py": ("limits", ["mesh", "bench", "hotpath", "--ops", "10"]),
    "bench/suite.py": ("limits", ["mesh", "bench", "suite", "--quick"]),
    "governor/tui.py": ("textual", ["governord", "ui", "--addr", "127.0.0.1:1"]),
}
HIDDEN = """
import sys
sys.modules[{module!r}] = None  # as if not installed
sys.argv = {argv!r}
if sys.argv[0] == "mesh":
    from mesh.cli import main
else:
    from governor.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_every_import_of_an_extra_is_guarded_by_a_command() -> None:
    pattern = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.M)
    found = set()
    for pkg in ("mesh", "governor", "ratemesh", "sim", "bench"):
        for path in (ROOT / pkg).rglob("*.py"):
            if {m for m in pattern.findall(path.read_text()) if m in OPTIONAL}:
                found.add(str(path.relative_to(ROOT)))
    assert found <= set(GUARDED), (
        f"imports an extra with no guarded command: {found - set(GUARDED)}"
    )
    assert set(EXTRAS) <= OPTIONAL


@pytest.mark.parametrize("where", sorted(GUARDED))
def test_a_command_without_its_extra_names_it_in_one_line(where: str, tmp_path: Path) -> None:
    module, argv = GUARDED[where]
    argv = [a.format(tmp=tmp_path) for a in argv]
    p = subprocess.run(
        [sys.executable, "-c", HIDDEN.format(module=module, argv=argv)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert module in lines[0] and "pip install" in lines[0], lines[0]
