"""What the deploy tests read: the manifests, and a pod's files and environment rebuilt from
them, so a config is validated as the container would see it.

A ConfigMap or Secret volume becomes files under ``root`` at its ``mountPath``; an absolute
path in a mounted config that points into a mount is re-rooted there (the one rewrite: the
test cannot write /etc). Secret values are stand-ins of the right shape (>= 16 bytes), since
the real ones are the operator's (deploy/k8s/secrets.example.yaml).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
FIELD_REFS = {"status.podIP": "10.0.0.5", "metadata.name": "mesh-node-7d9f-x2v4q"}


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every document of every manifest in deploy/k8s."""
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_docs() if d["kind"] == kind}


def stand_in(key: str) -> str:
    """A value of the right shape for `key`: a DNS label (a replica's name may be one) of
    at least 16 bytes (a secret's least)."""
    return f"stand-in-{key.replace('_', '-')}-0123456789abcdef"


def cli(name: str) -> str:
    """The console script installed beside this interpreter (the project's venv)."""
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    which = shutil.which(name)
    assert which is not None, f"{name} is not installed"
    return which


def validate(tool: str, config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``mesh validate`` / ``governord validate`` on ``config``, as a process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "RATEMESH_"))}
    return subprocess.run(
        [cli(tool), "validate", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
        cwd=config.parent,
    )


class Pod:
    """One container's mounted files and environment, under ``root``."""

    def __init__(self, root: Path, template: dict[str, Any], container: str) -> None:
        self.root = root
        spec = template["spec"]
        (self.container,) = [c for c in spec["containers"] if c["name"] == container]
        self.mounts: list[str] = []
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        configmaps, secrets = by_kind("ConfigMap"), by_kind("Secret")
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            where = root / mount["mountPath"].lstrip("/")
            where.mkdir(parents=True, exist_ok=True)
            self.mounts.append(mount["mountPath"].rstrip("/") + "/")
            if "configMap" in volume:
                data = configmaps[volume["configMap"]["name"]]["data"]
                for key, text in data.items():
                    (where / key).write_text(self._reroot(text))
            elif "secret" in volume:
                secret = secrets[volume["secret"]["secretName"]]
                keys = [i["key"] for i in volume["secret"].get("items", [])] or list(
                    secret["stringData"]
                )
                for key in keys:
                    assert key in secret["stringData"], (volume, key)
                    (where / key).write_text(stand_in(key))
        self.env: dict[str, str] = {}
        for var in self.container.get("env", []):
            if "value" in var:
                self.env[var["name"]] = var["value"]
            elif "fieldRef" in var["valueFrom"]:
                self.env[var["name"]] = FIELD_REFS[var["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                assert ref["key"] in secrets[ref["name"]]["stringData"], ref
                self.env[var["name"]] = stand_in(ref["key"])

    def _reroot(self, text: str) -> str:
        return text.replace(" /etc/ratemesh/", f" {self.root}/etc/ratemesh/")

    def path(self, in_container: str) -> Path:
        return self.root / in_container.lstrip("/")
