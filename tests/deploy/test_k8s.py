"""deploy/k8s: every manifest against the Kubernetes schemas (kubernetes-validate ships them,
so this runs offline), the references between manifests, and every config a pod mounts
through the real validators (mesh validate, governord validate) with the pod's files and
environment (tests/deploy/_files.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy._files import Pod, by_kind, k8s_docs, validate

K8S_VERSION = "1.30.0"  # an older release than the package's newest: no newest-only fields
WORKLOADS = ("Deployment", "StatefulSet")


def _workloads() -> list[dict[str, Any]]:
    return [d for _, d in k8s_docs() if d["kind"] in WORKLOADS]


def _container(kind: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = by_kind(kind)[name]
    template = workload["spec"]["template"]
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == name]
    return template, container


@pytest.mark.parametrize("name,doc", k8s_docs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_manifest_validates_against_the_kubernetes_schemas(
    name: str, doc: dict[str, Any]
) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError


def test_the_schema_check_would_catch_a_mistake() -> None:
    bad = copy.deepcopy(by_kind("Deployment")["mesh-node"])
    bad["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    bad = copy.deepcopy(by_kind("Deployment")["mesh-node"])
    bad["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}  # a typo'd key
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_everything_is_in_one_namespace_and_each_selector_selects_a_workload() -> None:
    docs = [d for _, d in k8s_docs() if d["kind"] != "Namespace"]
    assert {d["metadata"]["namespace"] for d in docs} == {"ratemesh"}
    labels = [w["spec"]["template"]["metadata"]["labels"] for w in _workloads()]
    for d in docs:
        if d["kind"] in ("Service", "PodDisruptionBudget"):
            sel = d["spec"]["selector"]
            sel = sel.get("matchLabels", sel)
            assert any(sel.items() <= lab.items() for lab in labels), d["metadata"]["name"]
        if d["kind"] in WORKLOADS:
            assert d["spec"]["selector"]["matchLabels"].items() <= (
                d["spec"]["template"]["metadata"]["labels"].items()
            )
    budgets = [
        d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"
    ]
    pdbs = {b["app.kubernetes.io/name"] for b in budgets}
    assert pdbs == {"mesh-node", "governord", "etcd"}


def test_workers_are_a_deployment_behind_the_headless_service_their_config_resolves() -> None:
    peers = by_kind("Service")["ratemesh-peers"]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    cfg = yaml.safe_load(by_kind("ConfigMap")["ratemesh-node"]["data"]["mesh-node.yaml"])
    m = cfg["membership"]
    assert m["source"] == "dns" and m["record"] == "a"
    assert m["name"] == "ratemesh-peers.ratemesh.svc.cluster.local"
    assert m["port"] == peers["spec"]["ports"][0]["port"] == 7001
    assert cfg["member_id_env"] == "POD_IP"  # A records name members by address
    coord = cfg["policies"]["coordinator"]["addr"]
    governord = by_kind("Service")["governord"]
    grpc = [p["port"] for p in governord["spec"]["ports"] if p["name"] == "grpc"]
    assert coord == f"governord.ratemesh.svc.cluster.local:{grpc[0]}"
    etcd = yaml.safe_load(by_kind("ConfigMap")["ratemesh-node"]["data"]["mesh-node-etcd.yaml"])
    replicas = by_kind("StatefulSet")["etcd"]["spec"]["replicas"]
    assert etcd["membership"]["endpoints"] == [
        f"http://etcd-{i}.etcd.ratemesh.svc.cluster.local:2379" for i in range(replicas)
    ]


def test_governord_is_a_statefulset_on_postgres_with_the_password_from_a_secret() -> None:
    _, c = _container("StatefulSet", "governord")
    cfg = yaml.safe_load(by_kind("ConfigMap")["governord"]["data"]["governord.yaml"])
    assert cfg["store"].startswith("postgresql://governord@ratemesh-postgres.ratemesh.svc")
    assert ":" not in cfg["store"].split("//")[1].split("@")[0]  # no password in the DSN
    env = {e["name"]: e for e in c["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "ratemesh-postgres",
        "key": "password",
    }
    postgres = by_kind("StatefulSet")["ratemesh-postgres"]["spec"]["template"]["spec"]
    pg_env = {e["name"]: e for e in postgres["containers"][0]["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"] == env["PGPASSWORD"]["valueFrom"]
    assert pg_env["POSTGRES_USER"]["value"] == "governord"
    governord = by_kind("StatefulSet")["governord"]["spec"]
    assert governord["replicas"] == 2  # a leader and a standby on the PostgreSQL record
    assert governord["podManagementPolicy"] == "Parallel"  # a standby is never ready
    assert cfg["ha"] == {"lease_ms": 1500, "renew_ms": 250}


@pytest.mark.parametrize(
    "kind,name,port_name,paths",
    [
        ("Deployment", "mesh-node", "telemetry", {"/health/live", "/health/ready"}),
        ("StatefulSet", "governord", "http", {"/health/live", "/health/ready"}),
    ],
)
def test_probes_ask_health_on_the_port_the_config_serves_it_and_resources_are_set(
    kind: str, name: str, port_name: str, paths: set[str]
) -> None:
    _, c = _container(kind, name)
    probes = [c[p] for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in c]
    assert {p["httpGet"]["path"] for p in probes} == paths
    assert {p["httpGet"]["port"] for p in probes} == {port_name}
    (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == port_name]
    data = by_kind("ConfigMap")["ratemesh-node" if name == "mesh-node" else "governord"]["data"]
    cfg = yaml.safe_load(data[f"{name}.yaml"])
    served = cfg["telemetry_listen"] if name == "mesh-node" else cfg["metrics"]
    assert served == f"0.0.0.0:{port}"
    res = c["resources"]
    assert {"cpu", "memory"} <= res["requests"].keys() and "memory" in res["limits"]
    sec = c["securityContext"]
    assert sec["allowPrivilegeEscalation"] is False and sec["readOnlyRootFilesystem"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,name,tool,config",
    [
        ("Deployment", "mesh-node", "mesh", "/etc/ratemesh/config/mesh-node.yaml"),
        ("Deployment", "mesh-node", "mesh", "/etc/ratemesh/config/mesh-node-etcd.yaml"),
        ("StatefulSet", "governord", "governord", "/etc/ratemesh/config/governord.yaml"),
    ],
)
def test_every_mounted_config_passes_its_validator_in_the_pod(
    kind: str, name: str, tool: str, config: str, tmp_path: Path
) -> None:
    template, c = _container(kind, name)
    pod = Pod(tmp_path, template, name)
    if config.endswith(f"{name}.yaml"):  # the one the container runs
        assert c["args"][c["args"].index("--config") + 1] == config
    done = validate(tool, pod.path(config), pod.env)
    assert done.returncode == 0, done.stderr
    if tool == "mesh":
        result = json.loads(done.stdout)
        # the probes' port is on every interface; tenant detail there asks the operator's
        # token, which the pod holds: nothing to warn about
        assert result["ok"] is True and result["warnings"] == [], result
        assert result["peer_identity"] == ["fleet_secret"]
        if "etcd" not in config:
            assert result["identity"]["member_id"] == pod.env["POD_IP"]
            assert result["membership"] == "dns"
    else:
        assert "is valid: 1 tenant(s)" in done.stdout and ", TLS" in done.stdout
        assert "2 coordinator key(s)" in done.stdout


def test_every_secret_a_manifest_reads_is_in_the_example_with_that_key() -> None:
    secrets = by_kind("Secret")
    for w in _workloads():
        spec = w["spec"]["template"]["spec"]
        for c in spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]["stringData"], ref
        for v in spec.get("volumes", []):
            if "secret" in v:
                secret = secrets[v["secret"]["secretName"]]
                for item in v["secret"].get("items", []):
                    assert item["key"] in secret["stringData"]
            if "configMap" in v:
                assert v["configMap"]["name"] in by_kind("ConfigMap")


def test_the_node_and_governord_bootstrap_with_the_same_policies() -> None:
    node = by_kind("ConfigMap")["ratemesh-node"]["data"]["policies.yaml"]
    gov = by_kind("ConfigMap")["governord"]["data"]["policies.yaml"]
    assert yaml.safe_load(node) == yaml.safe_load(gov)
