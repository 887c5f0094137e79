"""What the distribution installs: the three packages, never generic top-level names.

`sim` and `bench` stay in the checkout (mesh/cli/_checkout.py); an installed `mesh sim` or
`mesh bench` says in one line that they run from one.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = {"ratemesh", "mesh", "governor"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("ratemesh-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_only_the_three_packages(wheel: Path) -> None:
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    info = {n for n in names if n.endswith(".dist-info")}
    assert len(info) == 1 and names - info == INSTALLED, sorted(names)


@pytest.mark.slow
def test_installed_sim_and_bench_say_they_run_from_a_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure wheel unpacked is an install
    for argv in (["sim", "list"], ["bench", "hotpath"]):
        code = f"import sys; from mesh.cli import main; sys.exit(main({argv!r}))"
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, out.stderr
        assert "from a checkout" in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith(f"mesh {' '.join(argv)}: "), out.stderr
