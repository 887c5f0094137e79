"""The wire codec: round trips, and bad input refused with a MessageError naming the field."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.errors import MessageError, MessageTypeError
from mesh.messages import (
    MAX_ITEMS,
    RateSnapshot,
    Rejection,
    RejectReason,
    ReportBatch,
    SnapshotBatch,
    UsageReport,
    decode,
    encode,
    from_wire,
    to_wire,
)
from mesh.policy import Metric, RateKey

K = RateKey("acme", Metric.READ_IOPS, 3)
KB = RateKey("acme", Metric.CLIENT_EGRESS_BYTES, 1)


def reports() -> ReportBatch:
    return ReportBatch("w1", 5, (UsageReport(K, "w1", 2, 7, iops_delta=3, denied_delta=4),
                                 UsageReport(KB, "w1", 2, 1, byte_delta=-512)))


def snapshots() -> SnapshotBatch:
    return SnapshotBatch("o1", 5, (RateSnapshot(K, 5, 9, 120, 10**12, 7, 2, 3, 250_000, 4),),
                         (Rejection(KB, RejectReason.NOT_OWNER, 6),))


@pytest.mark.parametrize("msg", [reports(), snapshots(), ReportBatch("w", 0, ()),
                                 SnapshotBatch("o", 0)])
def test_round_trip(msg: Any) -> None:
    assert decode(encode(msg)) == msg


def mutate(wire: list, path: tuple[int, ...], value: Any) -> list:
    import copy
    w = copy.deepcopy(wire)
    target = w
    for i in path[:-1]:
        target = target[i]
    target[path[-1]] = value
    return w


@pytest.mark.parametrize("path, value, field", [
    ((0,), 2, "schema"),
    ((1,), "bogus", "kind"),
    ((2,), "", "sender"),
    ((3,), -1, "ring_epoch"),
    ((4, 0, 0, 1), "read_ops", "reports[0].rate_key.metric"),
    ((4, 0, 0, 2), 0, "reports[0].rate_key.policy_generation"),
    ((4, 0, 2), "2", "reports[0].worker_epoch"),
    ((4, 0, 3), 0, "reports[0].sequence"),
    ((4, 0, 4), 2**63, "reports[0].iops_delta"),
    ((4, 0, 5), 10, "reports[0].byte_delta"),  # a bytes delta on a units metric
    ((4, 0, 6), -1, "reports[0].denied_delta"),
    ((4, 0, 7), 8, "reports[0].unacked_from"),  # above its own sequence
    ((4, 0, 1), "w2", "reports[0].worker_id"),  # not the batch's sender
    ((4, 0), [1, 2], "reports[0]"),
    ((4,), "nope", "reports"),
])
def test_bad_report_batch_names_the_field(path: tuple[int, ...], value: Any, field: str) -> None:
    wire = mutate(to_wire(reports()), path, value)
    with pytest.raises(MessageError) as info:
        decode(msgpack.packb(wire))
    assert info.value.field == field, info.value


@pytest.mark.parametrize("path, value, field", [
    ((4, 0, 8), 1_000_001, "snapshots[0].share_ppm"),
    ((4, 0, 9), 0, "snapshots[0].active_reporters"),
    ((4, 0, 3), -5, "snapshots[0].remaining"),
    ((5, 0, 1), "gone", "rejections[0].reason"),
])
def test_bad_snapshot_batch_names_the_field(path: tuple[int, ...], value: Any,
                                            field: str) -> None:
    wire = mutate(to_wire(snapshots()), path, value)
    with pytest.raises(MessageError) as info:
        decode(msgpack.packb(wire))
    assert info.value.field == field, info.value


def test_size_limits() -> None:
    data = encode(reports())
    with pytest.raises(MessageError, match="exceeds"):
        decode(data, max_bytes=len(data) - 1)
    with pytest.raises(MessageError, match="at most"):
        from_wire([1, "reports", "w", 0, [[["t", "read_iops", 1], "w", 0, 1, 1, 0, 0, 1]] *
                   (MAX_ITEMS + 1)])


def test_types_are_type_errors() -> None:
    with pytest.raises(MessageTypeError):
        decode("a string")  # type: ignore[arg-type]
    with pytest.raises(MessageTypeError):
        UsageReport(K, "w", "1", 1)  # type: ignore[arg-type]


wire_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=30,
)


@given(st.binary(max_size=256))
def test_random_bytes_only_ever_raise_message_errors(data: bytes) -> None:
    try:
        decode(data)
    except MessageError:
        pass


@given(st.one_of(wire_values, st.builds(lambda rest: [1, "reports", *rest],
                                        st.lists(wire_values, max_size=4)),
                 st.builds(lambda rest: [1, "snapshots", *rest],
                           st.lists(wire_values, max_size=5))))
def test_random_structures_only_ever_raise_message_errors(obj: Any) -> None:
    try:
        decode(msgpack.packb(obj))
    except MessageError:
        pass
