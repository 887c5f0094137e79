"""Malformed and hostile messages, on the codec and over a real channel: a clear status,
no state change, no crash; the member keeps serving good peers afterwards. Forged usage:
a stranger's reports and hand-overs, a member's implausible claims and refund
floods change nothing, and the node still leaves cleanly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench._procs import free_port
from mesh.core._validate import INT_MAX
from mesh.core.messages import (
    SCHEMA_VERSION,
    Handover,
    KeyHandover,
    ReportBatch,
    SnapshotBatch,
    UsageReport,
    decode,
    encode,
    to_wire,
)
from mesh.core.messages._columns import pack_column
from mesh.core.policy import Metric, RateKey
from mesh.errors import MessageError
from mesh.node import Mesh
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._wire import SCHEMA

MAX_BYTES = 8192
# The ring is {n, good}; `good` is a member that never runs (its address is closed), so
# hostile input can come from a member. n owns these tenants' keys in that ring.
KEY = RateKey("carol", Metric.READ_IOPS, 1)
POLICY = {
    "tenant_id": "carol",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 1000,
    "global_burst": 100,
    "local_burst_cap": 20,
}


def _good(sender: str = "good", epoch: int = 7, seq: int = 1) -> bytes:
    return encode(
        ReportBatch.of(
            sender, 1, (UsageReport(KEY, sender, epoch, seq, iops_delta=1, unacked_from=seq),)
        )
    )


VICTIM_RATE, VICTIM_BURST, VICTIM_B = 100, 10, 5  # the refund-flood victim: 100/s
VICTIM = {
    "tenant_id": "erin",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": VICTIM_RATE,
    "global_burst": VICTIM_BURST,
    "local_burst_cap": VICTIM_B,
}


def _start() -> Mesh:
    addr = f"127.0.0.1:{free_port()}"
    return Mesh(
        {
            "member_id": "n",
            "listen": addr,
            "max_message_bytes": MAX_BYTES,
            "membership": {
                "source": "static",
                "members": {"n": addr, "good": f"127.0.0.1:{free_port()}"},
            },
            "policies": {"inline": [POLICY, VICTIM]},
        }
    ).start()


@pytest.fixture(scope="module")
def node() -> Iterator[Mesh]:
    mesh = _start()
    try:
        yield mesh
    finally:
        mesh.stop()


def _exchange(
    addr: str,
    payloads: list[bytes],
    md: dict[str, str] | None = None,
) -> tuple[grpc.StatusCode, str, list[bytes]]:
    metadata = md if md is not None else {MEMBER_MD: "good", SCHEMA_MD: SCHEMA, EPOCH_MD: "7"}
    with grpc.insecure_channel(addr) as ch:
        call = ch.stream_stream(EXCHANGE)(
            iter(payloads), metadata=tuple(metadata.items()), timeout=2
        )
        replies: list[bytes] = []
        try:
            for r in call:
                replies.append(r)
                if len(replies) >= len(payloads):
                    break
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or "", replies
        call.cancel()
        return grpc.StatusCode.OK, "", replies


def _owner_state(node: Mesh) -> tuple[int, int]:
    h = node.health()["owner"]
    return h["applied_units"], h["duplicates"]


CASES: list[tuple[str, list[bytes], dict[str, str] | None, grpc.StatusCode, str]] = [
    ("no metadata", [_good()], {}, grpc.StatusCode.FAILED_PRECONDITION, "schema"),
    (
        "wrong schema",
        [_good()],
        {MEMBER_MD: "good", SCHEMA_MD: "1", EPOCH_MD: "7"},
        grpc.StatusCode.FAILED_PRECONDITION,
        "schema",
    ),
    (
        "no member",
        [_good()],
        {SCHEMA_MD: SCHEMA, EPOCH_MD: "7"},
        grpc.StatusCode.INVALID_ARGUMENT,
        MEMBER_MD,
    ),
    ("garbage", [b"\xc1\xff\x00garbage"], None, grpc.StatusCode.INVALID_ARGUMENT, "msgpack"),
    ("not an array", [msgpack.packb({"a": 1})], None, grpc.StatusCode.INVALID_ARGUMENT, "message"),
    (
        "bad field",
        [
            msgpack.packb(
                [
                    SCHEMA_VERSION,
                    "reports",
                    "peer",
                    1,
                    7,
                    [["acme", "read_iops", 0]],
                    *[pack_column([1])] * 4,
                ]
            )
        ],
        None,
        grpc.StatusCode.INVALID_ARGUMENT,
        "policy_generation",
    ),
    ("other sender", [_good(sender="mallory")], None, grpc.StatusCode.INVALID_ARGUMENT, "sender"),
    (
        "wrong worker_epoch",
        [_good(epoch=8)],
        None,
        grpc.StatusCode.FAILED_PRECONDITION,
        "worker_epoch",
    ),
    (
        "snapshot kind",
        [encode(SnapshotBatch("good", 1))],
        None,
        grpc.StatusCode.INVALID_ARGUMENT,
        "kind",
    ),
    ("oversized", [b"\x00" * (MAX_BYTES * 2)], None, grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
]


@pytest.mark.parametrize("name, payloads, md, code, mentions", CASES, ids=[c[0] for c in CASES])
def test_bad_message_gets_a_clear_status_and_changes_nothing(
    node: Mesh,
    name: str,
    payloads: list[bytes],
    md: dict[str, str] | None,
    code: grpc.StatusCode,
    mentions: str,
) -> None:
    before = _owner_state(node)
    got, details, _ = _exchange(node.address, payloads, md)
    assert got == code, f"{name}: {got} {details}"
    assert mentions in details, f"{name}: details {details!r} should name {mentions!r}"
    assert _owner_state(node) == before


def test_a_good_peer_is_served_after_hostile_ones(node: Mesh) -> None:
    applied, _ = _owner_state(node)
    epoch = 1000 + applied  # a fresh incarnation each run of this test
    md = {MEMBER_MD: "good", SCHEMA_MD: SCHEMA, EPOCH_MD: str(epoch)}
    code, details, replies = _exchange(node.address, [_good("good", epoch, 1)], md)
    assert code == grpc.StatusCode.OK, details
    reply = decode(replies[0])
    assert isinstance(reply, SnapshotBatch) and reply.snapshots[0].rate_key == KEY
    assert reply.snapshots[0].ack_sequence_for_receiver == 1
    assert _owner_state(node)[0] == applied + 1
    # A retry keeps worker_epoch and sequence: applied once, the second is a duplicate.
    code, _, _ = _exchange(node.address, [_good("good", epoch, 1)], md)
    assert code == grpc.StatusCode.OK
    assert _owner_state(node)[0] == applied + 1


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_tree = st.recursive(
    _leaf,
    lambda kids: (
        st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=4), kids, max_size=4)
    ),
    max_leaves=30,
)


def _mutate(wire: Any, path: list[int], value: Any) -> Any:
    if not path or not isinstance(wire, (list, tuple)) or not wire:
        return value
    i = path[0] % len(wire)
    return [(_mutate(w, path[1:], value) if j == i else w) for j, w in enumerate(wire)]


@pytest.mark.slow
@settings(max_examples=300)
@given(st.binary(max_size=256))
def test_codec_random_bytes_only_message_error(data: bytes) -> None:
    try:
        decode(data)
    except MessageError:
        pass


@pytest.mark.slow
@settings(max_examples=300)
@given(st.lists(st.integers(min_value=0, max_value=10), max_size=5), _tree)
def test_codec_mutated_messages_only_message_error(path: list[int], value: Any) -> None:
    wire = to_wire(ReportBatch.of("p", 1, (UsageReport(KEY, "p", 1, 1, iops_delta=1),)))
    try:
        decode(msgpack.packb(_mutate(wire, path, value), use_bin_type=True))
    except MessageError:
        pass


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10), max_size=5), _tree)
def test_mutated_messages_over_a_real_channel(node: Mesh, path: list[int], value: Any) -> None:
    wire = to_wire(ReportBatch.of("good", 1, (UsageReport(KEY, "good", 7, 1, iops_delta=1),)))
    payload = msgpack.packb(_mutate(wire, path, value), use_bin_type=True)
    try:
        decode(payload, max_bytes=MAX_BYTES)
        valid = True
    except MessageError:
        valid = False
    before = _owner_state(node)
    code, details, _ = _exchange(node.address, [payload])
    if valid:
        assert code in (
            grpc.StatusCode.OK,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        ), details
    else:
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), (
            f"{code}: {details}"
        )
        assert _owner_state(node) == before
    assert node.health()["status"] == "serving"


# -- forged usage -----------------------------------------------------------------


def _md(member: str, epoch: int) -> dict[str, str]:
    return {MEMBER_MD: member, SCHEMA_MD: SCHEMA, EPOCH_MD: str(epoch)}


def _report(sender: str, epoch: int, seq: int, delta: int, key: RateKey = KEY) -> bytes:
    return encode(
        ReportBatch.of(
            sender, 1, (UsageReport(key, sender, epoch, seq, iops_delta=delta, unacked_from=seq),)
        )
    )


def _stream(addr: str, payloads: Iterable[bytes], md: dict[str, str]) -> grpc.StatusCode:
    """Send every payload on one stream, reading replies; we end it (CANCELLED) once the
    last was sent and answered. Any other status is the server's."""
    calls: list[Any] = []

    def requests() -> Iterator[bytes]:
        yield from payloads
        time.sleep(0.3)  # the replies to the last ones
        calls[0].cancel()

    with grpc.insecure_channel(addr) as ch:
        calls.append(ch.stream_stream(EXCHANGE)(requests(), metadata=tuple(md.items()), timeout=10))
        try:
            for _ in calls[0]:
                pass
        except grpc.RpcError as exc:
            return grpc.StatusCode.OK if exc.code() == grpc.StatusCode.CANCELLED else exc.code()
        return grpc.StatusCode.OK


def _admit_for(node: Mesh, tenant: str, seconds: float) -> tuple[int, float]:
    """Offer the tenant far more than its limit for `seconds`; (admitted, elapsed s)."""
    admitted, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        for _ in range(20):
            admitted += node.try_admit(tenant, "read_iops").allowed
        time.sleep(0.0005)
    return admitted, elapsed


@pytest.mark.slow
def test_forged_usage_from_a_stranger_or_a_member_changes_nothing() -> None:
    """The issue's attack: `mallory`, in no ring, claims 2^63-1 units of a tenant's key and
    hands over a key whose bucket it says is 292 years in debt; `good`, a member, claims
    2^63-1 too. The tenant keeps admitting at its rate and the node leaves cleanly."""
    node = _start()
    try:
        _admit_for(node, "carol", 0.1)  # the key is open and reported
        applied = node.health()["owner"]["applied_units"]
        forged = KeyHandover(KEY, INT_MAX, INT_MAX, INT_MAX)
        payloads = [_report("mallory", 1, 1, INT_MAX), encode(Handover("mallory", 1, (forged,)))]
        # mallory is refused at the stream's open, before a message is read (mesh.peer)
        assert _stream(node.address, payloads, _md("mallory", 1)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert node.health()["peer"]["refused"]["not_member"] == 1
        assert _stream(node.address, [_report("good", 5, 1, INT_MAX)], _md("good", 5)) == (
            grpc.StatusCode.OK
        )
        owner = node.health()["owner"]
        assert owner["refused"] == {
            "not_member": 0,
            "over_claim": 1,
            "over_refund": 0,
            "bad_watermark": 0,
        }
        assert owner["applied_units"] >= applied  # only n's own usage since
        admitted, elapsed = _admit_for(node, "carol", 1.0)
        # carol: 1000/s. The attack took her to 3/s; half her rate is far from that and
        # holds while a loaded CI machine slows the node's ticks (0.78 was seen under load).
        assert admitted >= 0.5 * 1000 * elapsed, (admitted, elapsed)
    finally:
        node.stop()  # a poisoned owner raised MessageError here: ahead_ns > INT_MAX


@pytest.mark.slow
def test_a_refund_flood_from_a_member_does_not_raise_a_tenant_over_its_limit() -> None:
    """`good` reports 5 units of `erin`, then refunds 10^6 units every 5 ms for a second
    while the node offers erin far more than its 100/s: admissions stay within the limit."""
    node = _start()
    key = RateKey("erin", Metric.READ_IOPS, 1)

    def flood() -> Iterator[bytes]:
        yield _report("good", 9, 1, 5, key)
        for seq in range(2, 202):
            time.sleep(0.005)
            yield _report("good", 9, seq, -1_000_000, key)

    try:
        _admit_for(node, "erin", 0.3)  # drain the bucket: the limit binds from here
        codes: list[grpc.StatusCode] = []
        t = threading.Thread(
            target=lambda: codes.append(_stream(node.address, flood(), _md("good", 9)))
        )
        t.start()
        admitted, elapsed = _admit_for(node, "erin", 1.0)
        t.join(10)
        assert codes == [grpc.StatusCode.OK]
        limit = VICTIM_RATE * elapsed + VICTIM_BURST + 2 * VICTIM_B
        assert admitted <= limit, (admitted, limit)
        assert node.health()["owner"]["refused"]["over_refund"] >= 190
    finally:
        node.stop()
