"""deploy/Dockerfile, read as text (no docker on the test machine): each daemon's stage runs
as a non-root user, has a HEALTHCHECK on a /health path of a port it exposes and its config
serves, and starts a console script the package installs with a config path the manifests
mount; every file it copies exists."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.deploy._files import DEPLOY, ROOT, by_kind

DOCKERFILE = DEPLOY / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    lines: list[tuple[str, str]] = field(default_factory=list)  # (instruction, argument)

    def all(self, instruction: str) -> list[str]:
        return [arg for ins, arg in self.lines if ins == instruction]

    def last(self, instruction: str) -> str:
        found = self.all(instruction)
        assert found, f"stage {self.name} has no {instruction}"
        return found[-1]


def _stages() -> dict[str, Stage]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())  # continuation lines joined
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ins, _, arg = line.partition(" ")
        ins, arg = ins.upper(), arg.strip()
        if ins == "FROM":
            m = re.fullmatch(r"(\S+)(?: AS (\S+))?", arg, re.IGNORECASE)
            assert m, line
            current = stages[m[2]] = Stage(m[2], m[1])
        else:
            assert current is not None, line
            current.lines.append((ins, arg))
    return stages


def _inherited(stages: dict[str, Stage], name: str, instruction: str) -> list[str]:
    """What ``instruction`` says in ``name`` and the stages it is built FROM."""
    stage = stages[name]
    own = stage.all(instruction)
    parent = stages.get(stage.base)
    return (_inherited(stages, parent.name, instruction) if parent else []) + own


def _exec_form(arg: str) -> list[str]:
    value: Any = json.loads(arg)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arg
    return value


def test_the_image_is_python_311_slim() -> None:
    stages = _stages()
    assert {s.base for s in stages.values() if s.base not in stages} == {"python:3.11-slim"}


@pytest.mark.parametrize(
    "target,script,port,config_map",
    [("mesh-node", "mesh", 9101, "ratemesh-node"), ("governord", "governord", 9102, "governord")],
)
def test_each_daemon_stage(target: str, script: str, port: int, config_map: str) -> None:
    stages = _stages()
    users = _inherited(stages, target, "USER")
    assert users, "no USER: the daemon would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, users  # numeric: runAsNonRoot can check it
    pods = [
        w["spec"]["template"]["spec"]
        for kind in ("Deployment", "StatefulSet")
        for w in by_kind(kind).values()
    ]
    (pod,) = [p for p in pods if p["containers"][0]["image"].startswith(f"ratemesh/{target}:")]
    assert (
        pod["securityContext"]["runAsUser"] == int(uid) and pod["securityContext"]["runAsNonRoot"]
    )

    check = stages[target].last("HEALTHCHECK")
    assert re.search(r"--interval=\d+s", check) and re.search(r"--timeout=\d+s", check)
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/health\S*?)'", check)
    assert url, check
    assert int(url[1]) == port and url[2] in ("/health", "/health/live")
    exposed = {int(p) for arg in stages[target].all("EXPOSE") for p in arg.split()}
    assert port in exposed

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = _exec_form(stages[target].last("ENTRYPOINT"))
    assert entry == [script] and script in scripts
    cmd = _exec_form(stages[target].last("CMD"))
    config = cmd[cmd.index("--config") + 1]
    (container,) = pod["containers"]
    assert container["args"] == cmd  # the manifest runs what the image runs by default
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    directory, _, file = config.rpartition("/")
    volume = [v for v in pod["volumes"] if v["name"] == mounts[directory]][0]
    assert volume["configMap"]["name"] == config_map
    data = by_kind("ConfigMap")[config_map]["data"]
    assert file in data
    cfg = yaml.safe_load(data[file])
    assert (cfg.get("telemetry_listen") or cfg.get("metrics")) == f"0.0.0.0:{port}"


def test_every_copied_path_exists_and_the_package_is_installed_from_it() -> None:
    stages = _stages()
    copies = [arg for s in stages.values() for arg in s.all("COPY") if "--from=" not in arg]
    for arg in copies:
        *sources, _dest = arg.split()
        for src in sources:
            assert (ROOT / src).exists(), src
    copied = {src for arg in copies for src in arg.split()[:-1]}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {p.rstrip("*") for p in packages["packages"]["find"]["include"]}
    assert wanted | {"pyproject.toml", "README.md"} <= copied
    assert any("pip install /src" in arg for arg in stages["build"].all("RUN"))
