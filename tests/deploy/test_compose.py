"""deploy/compose.yaml, parsed as compose would (anchors merged, ${VAR:?...} filled from
stand-in values): 3 mesh nodes + etcd + governord + PostgreSQL, images and build targets
that the Dockerfile and the Kubernetes manifests name alike, the files it mounts exist, and
every mounted config passes its validator with the service's environment."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy._files import DEPLOY, ROOT, by_kind, stand_in, validate

COMPOSE = DEPLOY / "compose.yaml"
_VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::\?[^}]*)?\}")


def _compose() -> dict[str, Any]:
    text = COMPOSE.read_text()
    # every secret is required (${VAR:?...}): a compose run without it stops, never empties
    assert not re.search(r"\$\{[A-Z0-9_]+(:-|-)", text), "no defaults for secrets"
    filled = _VAR.sub(lambda m: stand_in(m[1].lower()), text)
    doc: dict[str, Any] = yaml.safe_load(filled)
    return doc


def test_the_services_and_what_they_wait_for() -> None:
    services = _compose()["services"]
    assert set(services) == {"etcd", "postgres", "governord", "node-1", "node-2", "node-3"}
    for name, svc in services.items():
        for dep, how in svc.get("depends_on", {}).items():
            assert dep in services and how == {"condition": "service_healthy"}, (name, dep)
            assert "healthcheck" in services[dep] or services[dep]["image"].startswith(
                "ratemesh/"  # the image's own HEALTHCHECK
            )
    assert set(services["node-1"]["depends_on"]) == {"etcd", "governord"}
    ids = [services[f"node-{i}"]["environment"]["MEMBER_ID"] for i in (1, 2, 3)]
    assert ids == ["node-1", "node-2", "node-3"]
    for i in (1, 2, 3):
        cmd = services[f"node-{i}"]["command"]
        assert cmd[cmd.index("--listen") + 1] == f"node-{i}:7001"  # dialable, in etcd


def test_images_and_build_targets_agree_with_the_dockerfile_and_the_manifests() -> None:
    services = _compose()["services"]
    targets = set(re.findall(r"^FROM \S+ AS (\S+)", (DEPLOY / "Dockerfile").read_text(), re.M))
    k8s_images = {
        c["image"]
        for kind in ("Deployment", "StatefulSet")
        for w in by_kind(kind).values()
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    for svc in services.values():
        if "build" not in svc:
            continue
        build = svc["build"]
        assert build["target"] in targets
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == (
            DEPLOY / "Dockerfile"
        )
        assert svc["image"] == f"ratemesh/{build['target']}:0.1.0" and svc["image"] in k8s_images
    assert {services[s]["image"] for s in ("etcd", "postgres")} <= k8s_images


def _mounts(svc: dict[str, Any]) -> dict[str, Path]:
    out = {}
    for spec in svc.get("volumes", []):
        parts = spec.split(":")
        if parts[0].startswith("."):
            host = (COMPOSE.parent / parts[0]).resolve()
            assert host.is_file(), spec
            assert host.is_relative_to(ROOT), spec
            out[parts[1]] = host
    return out


@pytest.mark.slow
@pytest.mark.parametrize("service,tool", [("node-1", "mesh"), ("governord", "governord")])
def test_every_mounted_config_passes_its_validator(service: str, tool: str, tmp_path: Path) -> None:
    svc = _compose()["services"][service]
    mounts = _mounts(svc)
    for inside, host in mounts.items():
        here = tmp_path / inside.lstrip("/")
        here.parent.mkdir(parents=True, exist_ok=True)
        here.write_text(host.read_text().replace(" /etc/ratemesh/", f" {tmp_path}/etc/ratemesh/"))
    cmd = svc["command"]
    config = cmd[cmd.index("--config") + 1]
    assert config in mounts
    env = {k: str(v) for k, v in svc["environment"].items()}
    done = validate(tool, tmp_path / config.lstrip("/"), env)
    assert done.returncode == 0, done.stderr
    if tool == "mesh":
        result = json.loads(done.stdout)
        assert result["ok"] and result["identity"]["member_id"] == "node-1"
        assert result["peer_identity"] == ["fleet_secret"] and result["membership"] == "etcd"
        # plaintext on the compose network, and telemetry that asks no credential on every
        # interface: the things it warns about, and says so (the sidecar has its own token)
        said = [w.split(":")[0] for w in result["warnings"]]
        assert said == ["listen", "telemetry_listen"], result["warnings"]
    else:
        assert "store postgres" in done.stdout and "3 bootstrap policies" in done.stdout


def test_the_three_nodes_mount_the_same_files() -> None:
    services = _compose()["services"]
    assert _mounts(services["node-1"]) == _mounts(services["node-3"])
