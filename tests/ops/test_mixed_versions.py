"""A fleet of mixed versions during a rolling upgrade (docs/upgrade.md): members a and b
speak wire schema 3; member c has been restarted as a release that speaks schema 4. Every
stream c opens, and every schema-4 message it sends on a schema-3 stream, is refused with
a status naming the schema, counted in `ratemesh_peer_refused_total{reason="bad_message"}`,
and changes nothing; a and b keep enforcing inside the envelope `N*b + R*d` for the limit
they own, and a limit owned by c (whose streams they cannot use) is answered with
`suspended: owner_unreachable`, disclosed on every verdict, never silently."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench._procs import free_port
from mesh.core.messages import SCHEMA_VERSION
from mesh.core.messages._columns import pack_column
from mesh.core.ring import Ring
from mesh.core.verdict import Suspension
from mesh.node import Mesh
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from ratemesh.envelope import excess_over_times

pytestmark = pytest.mark.slow

IDS = ["a", "b", "c"]
R, B, LOCAL_B = 400, 40, 10
SECONDS = 3.0
NEWER = SCHEMA_VERSION + 1


def _policy(tenant: str) -> dict[str, object]:
    return {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "target_rate": R,
        "global_burst": B,
        "local_burst_cap": LOCAL_B,
    }


def _owned_by(member: str, ring: Ring) -> str:
    from mesh.core.policy import Metric, RateKey

    i = 0
    while ring.owner_of(RateKey(f"t{i}", Metric.READ_IOPS, 1)) != member:
        i += 1
    return f"t{i}"


def _newer_stream(addr: str, *, schema_md: str, message_schema: int) -> tuple[grpc.StatusCode, str]:
    """What member c, one schema ahead, sends: a report batch of its schema."""
    body = msgpack.packb(
        [message_schema, "reports", "c", 1, 7, [["t0", "read_iops", 1]], *[pack_column([1])] * 4]
    )
    md = ((MEMBER_MD, "c"), (SCHEMA_MD, schema_md), (EPOCH_MD, "7"))
    with grpc.insecure_channel(addr) as ch:
        call = ch.stream_stream(EXCHANGE)(iter([body]), metadata=md, timeout=5)
        try:
            for _ in call:
                pass
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _refused(node: Mesh) -> float:
    text = node._require().telemetry.render().decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "ratemesh_peer_refused_total" and s.labels.get("reason") == "bad_message"
    )


@pytest.fixture
def fleet() -> Iterator[dict[str, Mesh]]:
    members = {m: f"127.0.0.1:{free_port()}" for m in IDS}  # c's address: nothing of ours
    ring = Ring(IDS, 1)
    policies = [_policy(_owned_by("a", ring)), _policy(_owned_by("c", ring))]
    nodes: dict[str, Mesh] = {}
    try:
        for m in ("a", "b"):
            cfg = {
                "member_id": m,
                "listen": members[m],
                "shutdown_drain_ms": 200,
                "membership": {"source": "static", "members": members},
                "policies": {"inline": policies},
            }
            nodes[m] = Mesh(cfg).start()
        yield nodes
    finally:
        for n in nodes.values():
            n.stop()


def test_a_newer_schema_is_refused_clearly_and_the_rest_keep_their_envelope(
    fleet: dict[str, Mesh],
) -> None:
    ring = Ring(IDS, 1)
    mine, cs = _owned_by("a", ring), _owned_by("c", ring)
    admitted: list[int] = []
    lock = threading.Lock()
    suspended: dict[str, set[object]] = {"a": set(), "b": set()}
    stop = threading.Event()

    def load(m: str) -> None:
        node = fleet[m]
        while not stop.is_set():
            for _ in range(10):
                v = node.try_admit(mine, "read_iops")
                if v.allowed:
                    with lock:
                        admitted.append(time.monotonic_ns())
                suspended[m].add(node.try_admit(cs, "read_iops").suspended)
            time.sleep(0.001)

    before = {m: _refused(n) for m, n in fleet.items()}
    threads = [threading.Thread(target=load, args=(m,)) for m in fleet]
    for t in threads:
        t.start()
    answers = []
    try:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:  # c retries as a restarted member does
            for n in fleet.values():
                answers.append(_newer_stream(n.address, schema_md=str(NEWER), message_schema=NEWER))
                answers.append(
                    _newer_stream(n.address, schema_md=str(SCHEMA_VERSION), message_schema=NEWER)
                )
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    # refused clearly: a status naming the schema, both versions in its detail
    for code, details in answers:
        assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)
        assert "schema" in details and str(NEWER) in details, details
        assert f"speaks {SCHEMA_VERSION}" in details, details
    # ... and counted, per member
    refused = {m: _refused(n) - before[m] for m, n in fleet.items()}
    assert sum(refused.values()) == len(answers) and all(refused.values()), refused
    # the rest keep enforcing: the limit a owns holds the envelope across a and b
    d_s = max(n.health()["d_ms"] for n in fleet.values()) / 1000
    bound = len(IDS) * LOCAL_B + R * d_s
    admitted.sort()
    excess = excess_over_times(admitted, [1] * len(admitted), R, B)
    assert len(admitted) > B and excess <= bound, (len(admitted), excess, bound)
    # the limit c owns is answered degraded, and says so on every verdict
    for m in fleet:
        assert Suspension.OWNER_UNREACHABLE in suspended[m], (m, suspended[m])
