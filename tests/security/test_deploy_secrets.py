"""Which secret each deployment artefact hands to whom (docs/security.md): the fleet secret
stays with the nodes; the workers that call a sidecar get the sidecar's own token.

The attack: an application pod that calls the admission API was handed the fleet secret (the
sidecar had no token of its own, so the fleet secret was its callers' token), and with it
could speak to peers as any listed member. Here a real `mesh node` runs the sidecar section
of the Kubernetes manifest with the pod's environment: the sidecar token admits, the fleet
secret is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench._procs import free_port, read_ready, spawn, stop
from tests.deploy._files import DEPLOY, Pod, by_kind, validate

FLEET = "ratemesh-fleet"
NODE_CONTAINER = "mesh-node"
REQUESTS = 40  # a worker's admits, all within the limit below
TIMEOUT_S = 30


def _workload_containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod template spec, container) for every container in deploy/k8s."""
    out = []
    for kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"):
        for name, w in by_kind(kind).items():
            spec = w["spec"]["template"]["spec"]
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                out.append((name, spec, c))
    return out


def _secret_refs(spec: dict[str, Any], c: dict[str, Any]) -> set[tuple[str, str]]:
    """(Secret name, key or '*') of every secret a container can read."""
    refs = set()
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs.add((ref["name"], ref["key"]))
    for e in c.get("envFrom", []):
        if "secretRef" in e:
            refs.add((e["secretRef"]["name"], "*"))
    mounted = {m["name"] for m in c.get("volumeMounts", [])}
    for v in spec.get("volumes", []):
        if v["name"] in mounted and "secret" in v:
            refs.add((v["secret"]["secretName"], "*"))
    return refs


def _node_k8s() -> tuple[dict[str, Any], dict[str, Any]]:
    (dep,) = [w for n, w in by_kind("Deployment").items() if n == NODE_CONTAINER]
    cfg = yaml.safe_load(by_kind("ConfigMap")["ratemesh-node"]["data"]["mesh-node.yaml"])
    return dep["spec"]["template"], cfg


def test_only_the_nodes_can_read_the_fleet_secret() -> None:
    readers = {
        name
        for name, spec, c in _workload_containers()
        if any(s == FLEET for s, _ in _secret_refs(spec, c))
    }
    assert readers == {NODE_CONTAINER}, readers
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    with_secret = {
        n
        for n, s in compose["services"].items()
        if "RATEMESH_FLEET_SECRET" in s.get("environment", {})
    }
    assert with_secret == {"node-1", "node-2", "node-3"}, with_secret


def test_the_k8s_sidecar_token_is_its_own_secret() -> None:
    template, cfg = _node_k8s()
    sc = cfg["sidecar"]
    var = sc.get("token_env")
    assert var and var != cfg["fleet_secret_env"], sc
    (c,) = [c for c in template["spec"]["containers"] if c["name"] == NODE_CONTAINER]
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"]}
    token_ref, fleet_ref = env[var], env[cfg["fleet_secret_env"]]
    assert token_ref["name"] != FLEET and token_ref["name"] != fleet_ref["name"], token_ref
    examples = by_kind("Secret")
    assert token_ref["key"] in examples[token_ref["name"]]["stringData"]


def test_the_compose_sidecar_token_is_its_own_variable() -> None:
    cfg = yaml.safe_load((DEPLOY / "compose" / "mesh-node.yaml").read_text())
    var = cfg["sidecar"].get("token_env")
    assert var and var != cfg["fleet_secret_env"], cfg["sidecar"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    env = compose["services"]["node-1"]["environment"]
    assert "RATEMESH_FLEET_SECRET" not in str(env[var]), env[var]


@pytest.mark.slow
def test_mesh_validate_in_the_pod_says_the_sidecar_uses_its_own_token(tmp_path: Path) -> None:
    template, _ = _node_k8s()
    pod = Pod(tmp_path, template, NODE_CONTAINER)
    done = validate("mesh", pod.path("/etc/ratemesh/config/mesh-node.yaml"), pod.env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {v["token"] for v in result["sidecar"].values()} == {"sidecar"}, result["sidecar"]
    assert not [w for w in result["warnings"] if w.startswith("sidecar")], result["warnings"]


def _admit(url: str, token: str) -> int:
    body = json.dumps({"tenant": "acme", "metric": "read_iops"}).encode()
    req = urllib.request.Request(
        url + "/v1/admit",
        data=body,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_a_worker_holds_the_sidecar_token_and_the_fleet_secret_opens_nothing(
    tmp_path: Path,
) -> None:
    """The manifest's sidecar section and the pod's environment, on loopback with auth
    required as it is off loopback: the worker's token is admitted every time; the fleet
    secret, which an application pod used to need, is refused every time."""
    template, k8s = _node_k8s()
    pod = Pod(tmp_path, template, NODE_CONTAINER)
    sidecar = dict(k8s["sidecar"], grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    sidecar["require_auth"] = True
    limit = {
        "tenant_id": "acme",
        "metric": "read_iops",
        "generation": 1,
        "mode": "local",
        "target_rate": 1,
        "global_burst": REQUESTS * 4,
        "local_burst_cap": REQUESTS * 4,
    }
    cfg = {
        "member_id": "a",
        "listen": f"127.0.0.1:{free_port()}",
        "fleet_secret_env": k8s["fleet_secret_env"],
        "sidecar": sidecar,
        "policies": {"inline": [limit]},
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in pod.env.items() if k.startswith("RATEMESH_")}
    proc = spawn(["-m", "mesh.cli", "node", "--config", str(path)], env=env)
    try:
        ready = read_ready(proc, timeout_s=60)
        url = f"http://{ready['sidecar']['http']}"
        fleet_secret = env[k8s["fleet_secret_env"]]
        worker_token = env[k8s["sidecar"]["token_env"]]
        assert fleet_secret != worker_token
        worker = [_admit(url, worker_token) for _ in range(REQUESTS)]
        assert worker.count(200) == REQUESTS, worker
        forged = [_admit(url, fleet_secret) for _ in range(REQUESTS)]
        assert forged.count(401) == REQUESTS, forged
        # and the worker is unaffected by the refused calls in between
        after = [_admit(url, worker_token) for _ in range(REQUESTS)]
        assert after.count(200) == REQUESTS, after
    finally:
        stop(proc)
