"""The README and the docs are run, not just read.

Every python block of README.md, docs/api.md and docs/governord.md is executed here (the
governed worker by tests/governor/test_readme.py, which needs a governord) and what it prints
is checked; the simulator's shell examples (docs/simulator.md) are run as written in a scratch
directory, and what the doc says they print is compared with what they print. Every relative
link in the README and in docs/ resolves inside the repository.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.test_cli import KEYS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
API = ROOT / "docs" / "api.md"
NODE = ROOT / "docs" / "node.md"
SIMULATOR = ROOT / "docs" / "simulator.md"
GOVERNORD = ROOT / "docs" / "governord.md"
BIN = Path(sys.executable).parent  # .venv/bin when run by the README's test command

# Per file, the heading each python block sits under, and who runs it. Every python block of
# these files is listed here (a block moved to another file takes its entry with it).
PYTHON_BLOCKS: dict[Path, dict[str, str]] = {
    README: {"Using the mesh core": "test_core_example_prints_what_the_readme_shows"},
    API: {
        "Running a mesh node": "test_node_example_stays_inside_its_envelope",
        "Call sites: a decorator and a context manager": (
            "test_call_site_example_prints_what_it_shows"
        ),
        "In-flight slots and chunked egress": "tests/mesh/node/test_slots.py",
        "Chunked egress": "tests/mesh/node/test_slots.py",
    },
    GOVERNORD: {"The daemon and the SDK": "tests/governor/test_readme.py"},
}
SETUP = "python3.11 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/mesh demo"
TEST = (
    "./scripts/install-deps && python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"
    " && .venv/bin/lint-imports && .venv/bin/python -m pytest -q"
)


def _blocks(doc: Path) -> list[tuple[str, str, str]]:
    """(heading, language, body) of every fenced block of `doc`, in order."""
    out: list[tuple[str, str, str]] = []
    heading, lang, body = "", None, []  # type: tuple[str, str | None, list[str]]
    for line in doc.read_text().splitlines():
        if lang is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith("```"):
                lang, body = line[3:].strip(), []
        elif line.startswith("```"):
            out.append((heading, lang, "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(line)
    assert lang is None, f"{doc.relative_to(ROOT)}: a code fence is not closed"
    return out


def _block(doc: Path, heading: str, lang: str, index: int = 0) -> str:
    found = [body for h, lg, body in _blocks(doc) if h == heading and lg == lang]
    name = doc.relative_to(ROOT)
    assert len(found) > index, f"{name}: no {lang or 'plain'} block {index} under {heading!r}"
    return found[index]


def _run(args: list[str], cwd: Path = ROOT, timeout: float = 120) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stderr[-3000:]}"
    return out.stdout


def _python(code: str, tmp_path: Path, timeout: float = 120) -> str:
    script = tmp_path / "example.py"
    script.write_text(code)
    return _run([sys.executable, str(script)], cwd=tmp_path, timeout=timeout)


# -- the two commands -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_two_commands() -> None:
    heading, lang, body = _blocks(README)[0]
    assert (heading, lang) == ("ratemesh", "sh")
    assert body.splitlines() == [SETUP, TEST]
    script = ROOT / "scripts" / "install-deps"
    assert script.stat().st_mode & stat.S_IXUSR
    text = script.read_text()
    for part in ("etcd-server", "dnsmasq", "iptables", "apt-get update", "apt-get install -y"):
        assert part in text, f"scripts/install-deps: no {part!r}"
    subprocess.run(["bash", "-n", str(script)], check=True)
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == TEST, ".ci/run must run exactly the README's test command"


@pytest.mark.slow
def test_mesh_demo_prints_its_summary() -> None:
    """The first command's last step: `mesh demo` ends with its JSON summary."""
    out = _run(["mesh", "demo"], timeout=120)
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["tenants"]) == {"noisy", "quiet"}
    for name, tenant in summary["tenants"].items():
        assert tenant["within_bound"] is True, (name, tenant)
        assert 0 < tenant["admitted"]


def test_the_readme_is_a_front_page() -> None:
    """Under 300 lines: what ratemesh is, the two commands, an example per kind of user, the
    figures and links; the rest lives in docs/."""
    assert len(README.read_text().splitlines()) < 300


# -- the python examples --------------------------------------------------------------------


@pytest.mark.parametrize("doc", list(PYTHON_BLOCKS), ids=lambda doc: doc.name)
def test_every_python_block_is_run(doc: Path) -> None:
    headings = [h for h, lang, _ in _blocks(doc) if lang == "python"]
    runners = PYTHON_BLOCKS[doc]
    assert sorted(headings) == sorted(runners), (
        f"{doc.relative_to(ROOT)}: a python block nobody runs"
    )
    here = Path(__file__).read_text()
    for heading, runner in runners.items():
        if runner.startswith("tests/"):  # run by another module, which names the heading
            assert heading in (ROOT / runner).read_text(), (heading, runner)
        else:
            assert f"def {runner}(" in here, runner


@pytest.mark.slow
def test_core_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    heading = "Using the mesh core"
    out = _python(_block(README, heading, "python"), tmp_path, timeout=60)
    assert out == _block(README, heading, "")  # the block after "It prints:"
    assert "rate_limited" in out and "policy_unknown" in out


@pytest.mark.slow
def test_node_example_stays_inside_its_envelope(tmp_path: Path) -> None:
    heading = "Running a mesh node"
    code = _block(API, heading, "python")
    assert len(code.strip().splitlines()) <= 30
    shown = _block(API, heading, "")
    pattern = (
        r"admitted (\d+) of 2000 offered; one exact meter: (\d+)\n"
        r"excess (-?\d+) <= N\*b \+ R\*d = ([\d.]+): (True|False)\n"
    )
    assert re.fullmatch(pattern, shown), "docs/api.md: the sample output has another shape"
    out = _python(code, tmp_path)
    m = re.fullmatch(pattern, out)
    assert m is not None, out
    admitted, ideal, excess = int(m[1]), int(m[2]), int(m[3])
    assert 0 < admitted <= 2000 and ideal >= 100 + 1000 * 0.5
    assert abs(admitted - ideal - excess) <= 1
    assert m[5] == "True", out


@pytest.mark.slow
def test_call_site_example_prints_what_it_shows(tmp_path: Path) -> None:
    heading = "Call sites: a decorator and a context manager"
    out = _python(_block(API, heading, "python"), tmp_path, timeout=60)
    assert out == _block(API, heading, "")


# -- the simulator's shell examples ---------------------------------------------------------


SIM = "The simulator: the mesh beside what users run today"


def _tables(text: str) -> dict[str, str]:
    """The tables `mesh sim run --table` prints, by their 'scenario NAME seed N' line."""
    out: dict[str, str] = {}
    for part in re.split(r"^(?=scenario \S+ seed \d+$)", text, flags=re.M):
        if part.strip():
            first = part.splitlines()[0]
            out[first] = "\n".join(line.rstrip() for line in part.strip().splitlines())
    return out


@pytest.mark.slow
def test_sim_list_names_the_shipped_scenarios() -> None:
    lines = _block(SIMULATOR, SIM, "sh").splitlines()
    assert lines[0] == ".venv/bin/mesh sim list"
    out = _run(["mesh", "sim", "list"], timeout=60)
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    shipped = {p.stem for p in (ROOT / "sim" / "scenarios").glob("*.yaml")}
    assert listed == shipped
    prose = " ".join(SIM_PROSE.split())
    for name in shipped:
        assert f"`{name}`" in prose, f"docs/simulator.md: scenario {name} is not named"


SIM_PROSE = SIMULATOR.read_text().split("# " + SIM, 1)[1].split("\n## ", 1)[0]


@pytest.mark.slow
def test_sim_examples_print_what_the_doc_shows(tmp_path: Path) -> None:
    """Each command of the simulator's block, as written, from a scratch directory holding
    the doc's `my-scenario.yaml` (the plot goes to the scratch docs/, not the repo's)."""
    (tmp_path / ".venv").symlink_to(BIN.parent)
    (tmp_path / "docs").mkdir()
    (tmp_path / "my-scenario.yaml").write_text(_block(SIMULATOR, SIM, "yaml"))
    printed = ""
    results = []
    for line in _block(SIMULATOR, SIM, "sh").splitlines():
        out = _run(["bash", "-c", line], cwd=tmp_path, timeout=300)
        if "--table" in line:
            printed += out
        if "--json" in line:
            results.append(json.loads(out))
    assert (tmp_path / "docs" / "noisy-neighbour.png").stat().st_size > 0
    assert _tables(printed) == _tables(_block(SIMULATOR, SIM, "")), (
        "update docs/simulator.md's sample output"
    )
    assert len(results) == 1
    result = results[0]
    assert (result["scenario"], result["seed"]) == ("my-scenario", 3)
    keys = KEYS  # the contract keys of DESIGN section 5, as the sim CLI test pins them
    for name, figures in result["strategies"].items():
        assert keys <= set(figures), (name, keys - set(figures))
    assert result["strategies"]["mesh"]["within_bound"] is True


# -- links ----------------------------------------------------------------------------------


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {
        _slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")
    }


def _documents() -> list[Path]:
    return [README, ROOT / "governor" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves_inside_the_repository() -> None:
    broken = []
    for doc in _documents():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: {target}"
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{where} (no such file in the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_docs_name_no_file_outside_the_repository() -> None:
    for doc in _documents():
        assert "../shared" not in doc.read_text(), doc


def test_paths_the_docs_name_exist() -> None:
    """`mesh/...`, `governor/...`, `sim/...` paths written in backquotes are real files or
    folders (a move that forgets the docs fails here)."""
    missing = []
    for doc in _documents():
        for path in re.findall(
            r"`((?:mesh|governor|sim|bench|ratemesh|tests|scripts|docs)"
            r"/[\w./-]*)`",
            doc.read_text(),
        ):
            base = ROOT if doc.parent in (ROOT, ROOT / "docs") else doc.parent
            if not (ROOT / path).exists() and not (base / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "\n".join(missing)


def test_the_architecture_names_every_import_contract() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    names = re.findall(r'^name = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert names
    for name in names:
        short = name.split(": ")[0] if len(name) > 90 else name
        assert short in text, f"docs/architecture.md does not name the contract {name!r}"


# `mesh bench hotpath` keys and a gRPC service name: dotted, but not Python names
NOT_MODULES = {
    "mesh.hot_key",
    "mesh.many_keys",
    "governor.v1.Governor",
    "ratemesh.coordinator.v1.Coordinator",  # gRPC service names
    "ratemesh.sidecar.v1.Admission",
    "ratemesh.sidecar.v1.Concurrency",
}


def test_dotted_names_the_docs_give_exist() -> None:
    """`mesh.core.shares.snapshot_allowance_ppm` and the like import (a rename that forgets
    the docs fails here)."""
    missing = []
    for doc in _documents():
        for name in set(
            re.findall(r"`((?:mesh|governor|sim|ratemesh)(?:\.\w+)+)`", doc.read_text())
        ):
            if name in NOT_MODULES:
                continue
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj: object = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    missing.append(f"{doc.relative_to(ROOT)}: {name}")
                break
    assert not missing, "\n".join(missing)


@pytest.mark.slow
def test_the_config_file_example_validates(tmp_path: Path) -> None:
    """`mesh validate` accepts docs/node.md's node config as written (beside the files it
    names: empty certificates and the policies of deploy/)."""
    (tmp_path / "node.yaml").write_text(_block(NODE, "The config file", "yaml"))
    for name in ("peer.pem", "peer.key", "ca.pem"):
        (tmp_path / name).write_text("")
    shutil.copy(ROOT / "deploy" / "policies.yaml", tmp_path / "policies.yaml")
    out = _run(["mesh", "validate", "--config", "node.yaml"], cwd=tmp_path, timeout=60)
    result = json.loads(out)
    assert result["ok"] is True and result["membership"] == "etcd", result
    assert result["identity"] == {"member_id": "a", "source": "config", "stable": True}


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


@pytest.mark.slow
@pytest.mark.parametrize(
    "present",
    [(), ("etcd", "dnsmasq", "iptables", "redis-server", "promtool", "chromium", "chromedriver")],
)
def test_install_deps_installs_only_what_is_missing(
    tmp_path: Path, present: tuple[str, ...]
) -> None:
    """scripts/install-deps on a machine without etcd, dnsmasq, iptables, redis-server,
    promtool and chromium (with its driver) asks apt-get for them (update, then install -y),
    and leaves apt alone when they are there. Every program it runs is a stub that logs its
    arguments; only bash and env are real."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install-deps", repo / "scripts" / "install-deps")
    bin_.mkdir()
    log = tmp_path / "log"
    for tool in ("bash", "env"):
        real = shutil.which(tool)
        assert real is not None
        (bin_ / tool).symlink_to(real)
    _stub(bin_ / "id", "echo 0")  # root
    for name in ("apt-get", "python3.11", *present):
        _stub(bin_ / name, f'echo "{name} $*" >> {log}')
    subprocess.run(
        ["bash", str(repo / "scripts" / "install-deps")],
        env={"PATH": str(bin_)},
        check=True,
        capture_output=True,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    apt = [c for c in calls if c.startswith("apt-get")]
    if present:
        assert apt == []
    else:
        assert apt == [
            "apt-get update -qq",
            "apt-get install -y -qq etcd-server dnsmasq iptables redis-server prometheus"
            " chromium chromium-driver",
        ]
