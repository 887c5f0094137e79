"""Every shell, python and YAML example of README.md and docs/*.md is run, or says why not.

`EXAMPLES` lists each fenced `sh`, `python` and `yaml` block, found by its file, the heading
it sits under, its language and its place among that heading's blocks of that language,
with how it is checked:

* `HERE`: run by this file: config files through `mesh validate` / `governord validate`
  (beside stub files for the paths they name, absolute ones moved into a scratch
  directory), python as written (a fragment after a prelude that makes the node it names),
  shell against a `mesh node` started here (its ports put where the example says 7003 and
  9101);
* `BY`: run as written by the test named;
* `SKIP`: not runnable here, and the reason (a cluster, a daemon or a tool this machine
  does not have, or a synopsis with placeholders).

A block added to the docs without an entry here fails `test_every_example_is_listed`, and
so does an entry whose block went away. The counts are printed (pytest -s) and asserted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench._procs import read_ready, spawn, stop
from tests.test_readme import _blocks

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LANGS = ("sh", "python", "yaml")
HERE, BY, SKIP = "run here", "run by", "not runnable"

Key = tuple[str, str, str, int]  # doc, heading, lang, index among that heading's lang blocks

SIDECAR_API = "The sidecar admission API"
ENVOY = "Envoy and Istio"
CALLERS = "Who may call: API keys and scopes"
DESCRIPTORS = "Descriptors: a second dimension under the tenant"
COOLDOWN = "The fleet-wide 429 cooldown (seed 003)"
SIM = "The simulator: the mesh beside what users run today"
FAILOVER = "governord failover: leader and standbys on PostgreSQL"
SLOTS = "In-flight slots and chunked egress"
SLOTS_TEST = (
    "tests/mesh/node/test_slots.py::test_the_api_docs_in_flight_slots_and_chunked_egress_blocks_run"
)
NO_CLUSTER = "needs a Kubernetes cluster and the images; tests/deploy checks the manifests"

EXAMPLES: dict[Key, tuple[str, str]] = {
    ("README.md", "ratemesh", "sh", 0): (BY, "tests/test_readme.py::test_the_two_commands"),
    ("README.md", "Using the mesh core", "python", 0): (
        BY,
        "tests/test_readme.py::test_core_example_prints_what_the_readme_shows",
    ),
    ("README.md", "Over the sidecar", "sh", 0): (HERE, "against a node"),
    ("README.md", "Pushing policy", "sh", 0): (
        SKIP,
        "needs a governord with a coordinator key and a policies.yaml beside it; `mesh "
        "policy apply` is run by tests/governor/server/test_coordinator.py",
    ),
    ("README.md", "Reading the envelope", "sh", 0): (HERE, "against a node"),
    ("docs/api.md", "Running a mesh node", "python", 0): (
        BY,
        "tests/test_readme.py::test_node_example_stays_inside_its_envelope",
    ),
    ("docs/api.md", "Call sites: a decorator and a context manager", "python", 0): (
        BY,
        "tests/test_readme.py::test_call_site_example_prints_what_it_shows",
    ),
    ("docs/cooldown.md", COOLDOWN, "python", 0): (HERE, "after a prelude"),
    ("docs/cooldown.md", COOLDOWN, "sh", 0): (HERE, "against a node"),
    ("docs/deploy.md", "Kubernetes", "sh", 0): (SKIP, NO_CLUSTER),
    ("docs/deploy.md", "Compose", "sh", 0): (
        SKIP,
        "needs a Docker daemon to build and start the images; tests/deploy checks the file",
    ),
    ("docs/failover.md", FAILOVER, "yaml", 0): (HERE, "governord validate"),
    ("docs/faults.md", "`DelayProxy`: a slow, dead or reset link", "python", 0): (
        HERE,
        "as written",
    ),
    ("docs/faults.md", "`Netns`: a process that loses the network (root)", "python", 0): (
        SKIP,
        "needs root and network namespaces, and elides the daemon's arguments (`...`); "
        "tests/governor run Netns where they can",
    ),
    ("docs/governor-api.md", "Example config", "yaml", 0): (HERE, "governord validate"),
    ("docs/governord.md", "The daemon and the SDK", "python", 0): (
        BY,
        "tests/governor/test_readme.py::test_the_docs_worker_is_short_and_runs",
    ),
    ("docs/node.md", "The config file", "yaml", 0): (
        BY,
        "tests/test_readme.py::test_the_config_file_example_validates",
    ),
    ("docs/policies.md", "The policies file, and the bootstrap", "yaml", 0): (
        HERE,
        "mesh validate",
    ),
    ("docs/policies.md", "Rates and amounts as text", "python", 0): (HERE, "as written"),
    ("docs/policies.md", DESCRIPTORS, "yaml", 0): (HERE, "mesh validate"),
    ("docs/policies.md", DESCRIPTORS, "python", 0): (HERE, "after a prelude"),
    ("docs/policies.md", CALLERS, "yaml", 0): (HERE, "governord validate"),
    ("docs/policies.md", CALLERS, "yaml", 1): (HERE, "mesh validate"),
    ("docs/policies.md", "Pushing and reading: `mesh policy`", "sh", 0): (
        SKIP,
        "a synopsis: optional flags in brackets and a key of `...`; `mesh policy` is run by "
        "tests/governor/server/test_coordinator.py",
    ),
    ("docs/quotas.md", "Config", "yaml", 0): (HERE, "mesh validate"),
    ("docs/redis.md", "Consent: nothing dials until the config says so", "yaml", 0): (
        HERE,
        "mesh validate",
    ),
    ("docs/runbook.md", "Alerts", "yaml", 0): (HERE, "promtool check config"),
    ("docs/sidecar.md", SIDECAR_API, "yaml", 0): (HERE, "mesh validate"),
    ("docs/sidecar.md", "A Go client", "sh", 0): (
        SKIP,
        "needs protoc with protoc-gen-go and protoc-gen-go-grpc (a Go toolchain)",
    ),
    ("docs/sidecar.md", "HTTP/JSON", "sh", 0): (HERE, "against a node, up to its TLS call"),
    ("docs/sidecar.md", "HTTP status, Retry-After and the RateLimit fields", "sh", 0): (
        HERE,
        "against a node",
    ),
    ("docs/sidecar.md", ENVOY, "yaml", 0): (HERE, "mesh validate"),
    ("docs/sidecar.md", ENVOY, "yaml", 1): (
        SKIP,
        "Envoy's own configuration, read by Envoy (not installed); the RLS it calls is "
        "tested by tests/mesh/sidecar",
    ),
    ("docs/sidecar.md", "Regenerating", "sh", 0): (
        BY,
        "tests/mesh/sidecar/test_proto.py::test_the_committed_module_is_what_the_proto_generates",
    ),
    ("docs/simulator.md", SIM, "sh", 0): (
        BY,
        "tests/test_readme.py::test_sim_examples_print_what_the_doc_shows",
    ),
    ("docs/simulator.md", SIM, "yaml", 0): (
        BY,
        "tests/test_readme.py::test_sim_examples_print_what_the_doc_shows",
    ),
    ("docs/strict.md", "Front-running: strict limits in the mesh", "yaml", 0): (
        HERE,
        "mesh validate",
    ),
    ("docs/api.md", SLOTS, "python", 0): (BY, SLOTS_TEST),
    ("docs/api.md", "Chunked egress", "python", 0): (BY, SLOTS_TEST),
    ("docs/gov.md", "Waiting, priorities and fail-open", "python", 0): (HERE, "after a prelude"),
    ("docs/operations-policy.md", "Previewing a change", "sh", 0): (
        SKIP,
        "names files and a fleet of its own (`tighter.yaml`, `node.yaml`); `mesh policy "
        "preview` is run by tests/mesh/peer/test_policy_preview.py",
    ),
    ("docs/policies.md", "Concurrency limits: in-flight caps", "yaml", 0): (
        HERE,
        "mesh validate",
    ),
    ("docs/policies.md", "Shadow posture", "yaml", 0): (HERE, "mesh validate"),
    ("docs/policies.md", "Shadow posture", "yaml", 1): (HERE, "mesh validate"),
    ("docs/postgres.md", "Consent: nothing dials until the config says so", "yaml", 0): (
        HERE,
        "mesh validate",
    ),
    ("docs/postgres.md", "Decommissioning a replica: `mesh fleet forget-member`", "sh", 0): (
        BY,
        "tests/mesh/node/test_forget_member.py::"
        "test_forget_member_stops_a_replaced_replicas_burn_counting_twice",
    ),
    ("docs/sidecar.md", "In-flight slots", "sh", 0): (
        BY,
        "tests/mesh/sidecar/test_slots_http.py::test_acquire_release_ttl_and_bounds",
    ),
}


def examples() -> dict[Key, str]:
    """Every sh, python and yaml block of README.md and docs/*.md, by key."""
    out: dict[Key, str] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        seen: dict[tuple[str, str], int] = {}
        for heading, lang, body in _blocks(doc):
            if lang not in LANGS:
                continue
            i = seen.get((heading, lang), 0)
            seen[(heading, lang)] = i + 1
            out[(str(doc.relative_to(ROOT)), heading, lang, i)] = body
    return out


def block(doc: str, heading: str, lang: str, i: int = 0) -> str:
    return examples()[(doc, heading, lang, i)]


def test_every_example_is_listed_and_each_skip_says_why() -> None:
    found = examples()
    assert set(found) - set(EXAMPLES) == set(), "examples with no entry in EXAMPLES"
    assert set(EXAMPLES) - set(found) == set(), "entries whose example is gone"
    for key, (how, note) in EXAMPLES.items():
        assert how in (HERE, BY, SKIP) and note, key
        if how == BY:
            path, _, name = note.partition("::")
            assert f"def {name}(" in (ROOT / path).read_text(), key
        if how == HERE:
            assert key in RUNNERS, f"{key}: marked {HERE!r} but nothing here runs it"
    counts = {how: sum(1 for h, _ in EXAMPLES.values() if h == how) for how in (HERE, BY, SKIP)}
    print(
        f"docs examples: {len(found)} in all; {counts[HERE]} run here, {counts[BY]} run by "
        f"other tests, {counts[SKIP]} not runnable (each with its reason)"
    )
    assert counts[HERE] + counts[BY] >= 3 * counts[SKIP]


def test_every_yaml_example_parses() -> None:
    for key, body in examples().items():
        if key[2] == "yaml":
            assert isinstance(yaml.safe_load(body), dict), key


# -- config files ---------------------------------------------------------------------------

KEY = "4f1c9e8d2a7b" * 3  # what the stub key and token files and the variables hold


def _scratch(tmp: Path, body: str) -> str:
    """`body` with each absolute path it names moved under `tmp`, and a stub at every file
    path it names (certificates and keys are not parsed by validation: their presence and
    non-emptiness are)."""
    for path in sorted(set(re.findall(r"(?<![\w.])/etc/[\w./-]+", body))):
        body = body.replace(path, str(tmp / path.lstrip("/")))
    for name in re.findall(r"[\w./-]+\.(?:pem|key|crt)\b|[\w./-]*token\b", body):
        p = Path(name) if name.startswith("/") else tmp / name
        if name.startswith(str(tmp)) or not name.startswith("/"):
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.exists():
                p.write_text(KEY + "\n")
    shutil.copy(ROOT / "deploy" / "policies.yaml", tmp / "policies.yaml")
    (tmp / "etc/ratelimit").mkdir(parents=True, exist_ok=True)
    (tmp / "etc/ratelimit/config.yaml").write_text("domain: basic\ndescriptors: []\n")
    return body


ENV = {
    "RATEMESH_REDIS_PASSWORD": KEY,
    "ACME_GOVERNOR_KEY": KEY,
    "POLICY_ADMIN_KEY": KEY,
    "MESH_WORKER_KEY": KEY[::-1],
    "RATEMESH_PG_DSN": "postgresql://127.0.0.1:5432/test",  # named only: validate dials nothing
}


def _validate(tmp: Path, program: str, body: str) -> dict[str, Any] | str:
    path = tmp / "config.yaml"
    path.write_text(_scratch(tmp, body))
    out = subprocess.run(
        [str(BIN / program), "validate", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp,
        env={**os.environ, **ENV},
    )
    assert out.returncode == 0, f"{program} validate: {out.stderr}{out.stdout}"
    try:
        result: dict[str, Any] = json.loads(out.stdout)
    except json.JSONDecodeError:
        return out.stdout
    return result


def _policies_file(tmp: Path, body: str) -> None:
    """A policies file: validated as the file a node config names."""
    (tmp / "limits.yaml").write_text(body)
    n = len(yaml.safe_load(body)["policies"])
    result = _validate(tmp, "mesh", "policies: {file: limits.yaml}\n")
    assert isinstance(result, dict) and result["policies"] == n, result


def _node_config(tmp: Path, body: str) -> None:
    result = _validate(tmp, "mesh", body)
    assert isinstance(result, dict) and result["ok"] is True, result


def _governord_config(tmp: Path, body: str) -> None:
    _validate(tmp, "governord", body)


def _governord_fragment(tmp: Path, body: str) -> None:
    """A section of governord's config: validated inside the smallest whole one."""
    from bench._procs import free_port

    _validate(
        tmp, "governord", f"store: sqlite:{tmp / 'g.db'}\nlisten: 127.0.0.1:{free_port()}\n{body}"
    )


def _failover(tmp: Path, body: str) -> None:
    """The leader's config on PostgreSQL; its TLS is governor-api.md's, so here plaintext."""
    _validate(tmp, "governord", body + "allow_plaintext: true\n")


def _prometheus(tmp: Path, body: str) -> None:
    """The external label the alert rules' runbook_url reads, in a prometheus.yml that
    promtool accepts."""
    from tests.mesh._util import require_binary

    rules = (ROOT / "deploy/alerts/ratemesh-rules.yaml").read_text()
    (label,) = set(re.findall(r"\$externalLabels\.(\w+)", rules))
    assert label in yaml.safe_load(body)["global"]["external_labels"]
    (tmp / "prometheus.yml").write_text(body)
    out = subprocess.run(
        [require_binary("promtool", "prometheus"), "check", "config", "prometheus.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- python ---------------------------------------------------------------------------------

COOLDOWN_PRELUDE = """
from mesh.node import Mesh
POLICY = {"tenant_id": "acme", "metric": "llm_tokens", "generation": 1,
          "target_rate": 1000, "global_burst": 100, "local_burst_cap": 20}
mesh = Mesh({"member_id": "a", "policies": {"inline": [POLICY]}}).start()
"""
COOLDOWN_CHECK = """
assert mesh.try_admit("acme", "llm_tokens").reason.value == "cooldown"
mesh.stop()
print("cooling")
"""
DESCRIPTOR_PRELUDE = """
import yaml
import mesh
from mesh.node import Mesh
POLICIES = yaml.safe_load({policies!r})["policies"]
node = Mesh({{"member_id": "a", "policies": {{"inline": POLICIES}}}}).start()
"""


def _python(tmp: Path, source: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=60, cwd=tmp
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _rates(tmp: Path, body: str) -> None:
    assert _python(tmp, body).strip() == "[10, '100/minute']"


def _as_written(tmp: Path, body: str) -> None:
    _python(tmp, body)


def _gov_slot(tmp: Path, body: str) -> None:
    """`slot()` as written, on this machine's slots (no governord named): the work runs."""
    prelude = (
        "import os\n"
        f"os.environ['GOV_DIR'] = {str(tmp / 'gov')!r}\n"
        "os.environ.pop('GOVERNOR_ADDR', None)\n"
        "def run_the_model():\n    print('ran')\n"
    )
    assert _python(tmp, prelude + body).strip() == "ran"


def _cooldown(tmp: Path, body: str) -> None:
    assert _python(tmp, COOLDOWN_PRELUDE + body + COOLDOWN_CHECK).strip() == "cooling"


def _descriptors(tmp: Path, body: str) -> None:
    policies = block("docs/policies.md", DESCRIPTORS, "yaml")
    source = DESCRIPTOR_PRELUDE.format(policies=policies) + body
    source += "\nprint(node.try_admit(upload, 'requests').mode)\nnode.stop()\n"
    assert _python(tmp, source).strip() == "global"


# -- shell, against a node ------------------------------------------------------------------

NODE_POLICIES = [
    {"tenant_id": "acme", "metric": "read_iops", "generation": 1, "target_rate": "100/minute"},
    {"tenant_id": "acme", "metric": "client_egress_bytes", "generation": 1},
    {"tenant_id": "acme", "metric": "llm_tokens", "generation": 1, "target_rate": 1000},
]
for _p, _b in zip(NODE_POLICIES, ((20, 5), (1 << 20, 1 << 18), (100, 20)), strict=True):
    _p.update(global_burst=_b[0], local_burst_cap=_b[1])
    _p.setdefault("target_rate", 1 << 20)


class Node:
    """A `mesh node` with the sidecar's HTTP API and telemetry, and how to run an example's
    shell against it: its addresses where the docs say 7003 and 9101, /etc/ratemesh's
    files in its scratch directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "etc/ratemesh").mkdir(parents=True)
        (tmp / "etc/ratemesh/acme-token").write_text(KEY + "\n")
        cfg = {
            "member_id": "a",
            "listen": "127.0.0.1:0",
            "telemetry_listen": "127.0.0.1:0",
            "sidecar": {
                "http_listen": "127.0.0.1:0",
                "tenant_tokens": {"acme": {"token_file": str(tmp / "etc/ratemesh/acme-token")}},
            },
            "policies": {"inline": NODE_POLICIES},
        }
        (tmp / "node.yaml").write_text(yaml.safe_dump(cfg))
        self.proc = spawn(["-m", "mesh.cli", "node", "--config", str(tmp / "node.yaml")])
        ready = read_ready(self.proc, timeout_s=30)
        self.telemetry, self.sidecar = ready["telemetry"], ready["sidecar"]["http"]
        # `mesh status --config node.yaml` dials the config's listen: the bound address
        cfg["listen"] = ready.get("listen") or ready.get("address") or cfg["listen"]
        (tmp / "node.yaml").write_text(yaml.safe_dump(cfg))

    def sh(self, body: str) -> str:
        body = body.replace("localhost:7003", self.sidecar)
        body = body.replace("127.0.0.1:9101", self.telemetry)
        body = body.replace("/etc/ratemesh/", f"{self.tmp}/etc/ratemesh/")
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.tmp,
            env=env,
        )
        assert out.returncode == 0, f"{body}\n{out.stderr}{out.stdout}"
        return out.stdout


def answers(out: str) -> list[Any]:
    """The JSON documents curl printed, one after another (curl adds no newline)."""
    dec, i, got = json.JSONDecoder(), 0, []
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        doc, i = dec.raw_decode(out, i)
        got.append(doc)
    return got


def _over_the_sidecar(node: Node, body: str) -> None:
    (verdict,) = answers(node.sh(body))
    assert verdict["allowed"] is True


def _reading_the_envelope(node: Node, body: str) -> None:
    out = node.sh(body)  # `mesh status` (each exit 0: the one member agrees with itself)
    assert "ratemesh_excess_bound{" in out, out


def _http_json(node: Node, body: str) -> None:
    local = body.split("# beyond loopback")[0]  # the rest calls a TLS host of the example's
    got = answers(node.sh(local))
    # verdicts as the doc shows them (admitted, or denied once the 429 example spent the
    # burst: the node is shared by these examples)
    assert got[0]["reason"] in ("admitted", "rate_limited") and "bound" in got[0], got[0]
    (batch,) = [a for a in got if "verdicts" in a]
    assert "read_lops" in batch["verdicts"][1]["error"]
    assert got[-1] == {"ok": True}


def _status_429(node: Node, body: str) -> None:
    for _ in range(25):  # past acme's burst of 20: the denial the example shows
        out = node.sh(body)
        if out.startswith("HTTP/1.1 429"):
            break
    assert out.startswith("HTTP/1.1 429"), out
    assert "retry-after:" in out.lower() and "ratelimit-policy:" in out.lower()


def _cooldown_sh(node: Node, body: str) -> None:
    got = answers(node.sh(body))
    assert got[0] == {"ok": True}  # the tenant's own token
    assert "error" in got[1]  # `...` is no token: refused, as it should be


RUNNERS: dict[Key, Any] = {
    ("README.md", "Over the sidecar", "sh", 0): _over_the_sidecar,
    ("README.md", "Reading the envelope", "sh", 0): _reading_the_envelope,
    ("docs/cooldown.md", COOLDOWN, "python", 0): _cooldown,
    ("docs/cooldown.md", COOLDOWN, "sh", 0): _cooldown_sh,
    ("docs/failover.md", FAILOVER, "yaml", 0): _failover,
    ("docs/faults.md", "`DelayProxy`: a slow, dead or reset link", "python", 0): _as_written,
    ("docs/governor-api.md", "Example config", "yaml", 0): _governord_config,
    ("docs/policies.md", "The policies file, and the bootstrap", "yaml", 0): _policies_file,
    ("docs/policies.md", "Rates and amounts as text", "python", 0): _rates,
    ("docs/policies.md", DESCRIPTORS, "yaml", 0): _policies_file,
    ("docs/policies.md", DESCRIPTORS, "python", 0): _descriptors,
    ("docs/policies.md", CALLERS, "yaml", 0): _governord_fragment,
    ("docs/policies.md", CALLERS, "yaml", 1): _node_config,
    ("docs/quotas.md", "Config", "yaml", 0): _node_config,
    ("docs/redis.md", "Consent: nothing dials until the config says so", "yaml", 0): _node_config,
    ("docs/runbook.md", "Alerts", "yaml", 0): _prometheus,
    ("docs/sidecar.md", SIDECAR_API, "yaml", 0): _node_config,
    ("docs/sidecar.md", "HTTP/JSON", "sh", 0): _http_json,
    ("docs/sidecar.md", "HTTP status, Retry-After and the RateLimit fields", "sh", 0): _status_429,
    ("docs/sidecar.md", ENVOY, "yaml", 0): _node_config,
    ("docs/strict.md", "Front-running: strict limits in the mesh", "yaml", 0): _node_config,
    ("docs/gov.md", "Waiting, priorities and fail-open", "python", 0): _gov_slot,
    ("docs/policies.md", "Concurrency limits: in-flight caps", "yaml", 0): _policies_file,
    ("docs/policies.md", "Shadow posture", "yaml", 0): _policies_file,
    ("docs/policies.md", "Shadow posture", "yaml", 1): _policies_file,
    (
        "docs/postgres.md",
        "Consent: nothing dials until the config says so",
        "yaml",
        0,
    ): _node_config,
}
AGAINST_A_NODE = {k for k, fn in RUNNERS.items() if fn.__code__.co_varnames[0] == "node"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "key", sorted(set(RUNNERS) - AGAINST_A_NODE), ids=lambda k: f"{k[0]}:{k[1]}:{k[2]}{k[3]}"
)
def test_the_example_runs(key: Key, tmp_path: Path) -> None:
    RUNNERS[key](tmp_path, examples()[key])


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("node"))
    try:
        yield n
    finally:
        stop(n.proc)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(AGAINST_A_NODE), ids=lambda k: f"{k[0]}:{k[1]}:{k[2]}{k[3]}")
def test_the_shell_example_runs_against_a_node(key: Key, node: Node) -> None:
    RUNNERS[key](node, examples()[key])
