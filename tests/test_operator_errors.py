"""An operator's mistake, through the real commands: one line on stderr naming the field or
file, exit status 2, never a traceback (part 4).

Each case starts `mesh` or `governord` as a process, as an operator would, so the whole path
from argv to exit status is what is checked.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mesh.cli import COMMANDS, _parser, command_of
from ratemesh.ports import free_port

POLICY = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 100,
    "global_burst": 10,
    "local_burst_cap": 5,
}
NOT_UTF8 = b"member_id: a\nname: caf\xe9\n"  # Latin-1, as an editor on another machine saved it


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something else is listening on for the length of the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def refused(module: str, *args: str, names: str, timeout_s: float = 60) -> str:
    """Run `python -m module args`; it must refuse in one line that contains `names`."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    # `mesh node` logs its config's warnings (e.g. no fleet secret) before it starts, as JSON
    # log lines; the refusal is the one plain line besides those
    lines = [ln for ln in out.stderr.splitlines() if not ln.startswith('{"ts":')]
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert len(lines) == 1, out.stderr
    assert names in lines[0], lines[0]
    return lines[0]


def mesh(*args: str, names: str) -> str:
    return refused("mesh.cli", *args, names=names)


def governord(*args: str, names: str) -> str:
    return refused("governor.cli", *args, names=names)


def node_config(tmp_path: Path, listen: str, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {
                "member_id": "solo",
                "listen": listen,
                "membership": {"source": "static", "members": {"solo": listen}},
                "policies": {"inline": [POLICY]},
            }
        )
    )
    return path


def governord_config(tmp_path: Path, **settings: object) -> Path:
    path = tmp_path / "governord.yaml"
    doc = {"listen": [f"127.0.0.1:{free_port()}"], "store": f"sqlite:{tmp_path / 'g.db'}"}
    path.write_text(json.dumps({**doc, **settings}))
    return path


def _commands(parser: argparse.ArgumentParser) -> set[tuple[str, ...]]:
    """Every (command, subcommand) path the parser accepts, read off its subparsers."""
    out: set[tuple[str, ...]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = _commands(sub)
                out |= {(name, *path) for path in inner} if inner else {(name,)}
    return out


def test_every_mesh_command_has_a_handler() -> None:
    """The parser and the dispatch table name the same commands (no silently missing one)."""
    parser = _parser()
    assert _commands(parser) == set(COMMANDS)
    for path in COMMANDS:  # and each parses to the handler's key
        argv = [*path, *REQUIRED.get(path, [])]
        assert command_of(parser.parse_args(argv)) == path


# The required flags of the commands that have some.
REQUIRED = {
    ("node",): ["--config", "x"],
    ("status",): ["--addr", "x"],
    ("policy", "preview"): ["x", "--current", "x"],
    ("validate",): ["--config", "x"],
    ("sim", "run"): ["--scenario", "x"],
    ("policy", "apply"): ["-f", "x", "--coordinator", "x"],
    ("policy", "list"): ["--coordinator", "x"],
    ("policy", "history"): ["acme", "--coordinator", "x"],
    ("policy", "rollback"): ["acme", "read_iops", "--to", "1", "--coordinator", "x"],
    ("fleet", "forget-member"): ["web-0"],
}


# -- mesh ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_mesh_validate_names_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    mesh("validate", "--config", str(bad), names=str(bad))


@pytest.mark.slow
def test_mesh_sim_run_names_a_scenario_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    mesh("sim", "run", "--scenario-file", str(bad), names=str(bad))


@pytest.mark.slow
@pytest.mark.parametrize("seconds", ["nan", "inf", "-1", "0"])
def test_mesh_demo_refuses_seconds_that_are_not_a_positive_number(seconds: str) -> None:
    for mode in ("--memory", "--loopback"):
        mesh("demo", mode, "--seconds", seconds, names="--seconds")


@pytest.mark.slow
def test_a_port_out_of_range_is_named_by_validate_and_by_node(tmp_path: Path) -> None:
    path = node_config(tmp_path, "127.0.0.1:99999")
    mesh("validate", "--config", str(path), names="listen")
    mesh("node", "--config", str(path), names="listen")
    mesh(
        "node",
        "--config",
        str(node_config(tmp_path, f"127.0.0.1:{free_port()}", "ok.yaml")),
        "--listen",
        "127.0.0.1:99999",
        names="--listen",
    )


@pytest.mark.slow
def test_a_second_node_on_a_taken_peer_port_fails_instead_of_sharing_it(tmp_path: Path) -> None:
    path = node_config(tmp_path, f"127.0.0.1:{free_port()}")
    argv = [sys.executable, "-m", "mesh.cli", "node", "--config", str(path)]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as first:
        try:
            assert first.stdout is not None
            ready = json.loads(first.stdout.readline())  # the first one serves
            assert ready["member_id"] == "solo"
            mesh("node", "--config", str(path), names="listen")
        finally:
            first.terminate()
            first.wait(30)


# -- governord -----------------------------------------------------------------------------


@pytest.mark.slow
def test_governord_validate_names_a_file_nested_too_deep(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("root: " + "[" * 5000 + "]" * 5000 + "\n")
    governord("validate", "--config", str(deep), names=str(deep))


@pytest.mark.slow
@pytest.mark.parametrize("value", ["-5", ".nan", "true"])
def test_governord_validate_names_a_bad_drain(tmp_path: Path, value: str) -> None:
    path = tmp_path / "drain.yaml"
    path.write_text(f"drain_s: {value}\n")
    governord("validate", "--config", str(path), names="drain_s")


@pytest.mark.slow
def test_governord_names_a_sqlite_store_it_cannot_open(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "g.db"
    governord("--config", str(governord_config(tmp_path, store=f"sqlite:{missing}")), names="store")
    # Read-only: the tests run as root, whom a chmod 0o555 directory does not stop, so the
    # store goes under a regular file, which no user can create anything beneath.
    plain = tmp_path / "a-file"
    plain.write_text("")
    governord(
        "--config", str(governord_config(tmp_path, store=f"sqlite:{plain}/g.db")), names="store"
    )


@pytest.mark.slow
def test_governord_names_an_unreachable_postgresql(tmp_path: Path) -> None:
    dsn = f"postgresql://governor@127.0.0.1:{free_port()}/governor?connect_timeout=5"
    line = governord("--config", str(governord_config(tmp_path, store=dsn)), names="store")
    assert "127.0.0.1" in line


@pytest.mark.slow
def test_governord_names_a_listen_port_in_use(tmp_path: Path, held_port: int) -> None:
    path = governord_config(tmp_path, listen=[f"127.0.0.1:{held_port}"])
    governord("--config", str(path), names="listen")
