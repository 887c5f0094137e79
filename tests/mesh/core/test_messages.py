"""The wire codec: round trips, and bad input refused with a MessageError naming the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.core.config import CoreConfig
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import (
    REPORT_ROWS_MAX,
    SCHEMA_VERSION,
    Cell,
    CellFold,
    CellPublish,
    CooldownNotice,
    CooldownReport,
    CooldownRow,
    FoldRow,
    Handover,
    KeyHandover,
    Message,
    RateSnapshot,
    Rejection,
    RejectReason,
    ReportBatch,
    ReporterWatermark,
    SnapshotBatch,
    UsageReport,
    _codec,
    decode,
    encode,
    from_wire,
    to_wire,
)
from mesh.core.messages._columns import pack_column
from mesh.core.messages._snapshot import ABOVE_BITS, above_applied, above_mask
from mesh.core.policy import Metric, RateKey
from mesh.core.shares import PPM
from mesh.errors import ConfigError, MessageError, MessageTypeError
from mesh.testing.fleet import MemoryFleet, Offered, drive
from tests.mesh._helpers import cache, policy

K = RateKey("acme", Metric.READ_IOPS, 3)
KB = RateKey("acme", Metric.CLIENT_EGRESS_BYTES, 1)


def reports() -> ReportBatch:
    return ReportBatch.of(
        "w1",
        5,
        (
            UsageReport(K, "w1", 2, 7, iops_delta=3, denied_delta=4),
            UsageReport(KB, "w1", 2, 1, byte_delta=-512),
        ),
    )


def snapshots() -> SnapshotBatch:
    return SnapshotBatch.of(
        "o1",
        5,
        (RateSnapshot(K, 5, 9, 120, 10**12, 7, 2, 3, 250_000, 4),),
        (Rejection(KB, RejectReason.NOT_OWNER, 6),),
    )


@pytest.mark.parametrize(
    "msg", [reports(), snapshots(), ReportBatch.of("w", 0, ()), SnapshotBatch("o", 0)]
)
def test_round_trip(msg: Any) -> None:
    assert decode(encode(msg)) == msg


# One message of every kind, and its bytes as the codec wrote them before `messages` was
# split into modules (schema 3), before `heard_batch`, `since_ages` and `floors_ppm` were
# added at the end
# (PREVIOUS: still decoded, with those fields empty). A change here is a wire change: add
# fields at the end (the decoder keeps reading the shape before), or bump SCHEMA_VERSION.
PREVIOUS: list[tuple[Any, str]] = [
    (
        ReportBatch.of(
            "w1",
            5,
            (
                UsageReport(K, "w1", 2, 7, iops_delta=3, denied_delta=4, unacked_from=5),
                UsageReport(KB, "w1", 2, 1, byte_delta=-512),
            ),
        ),
        "9a03a77265706f727473a2773105029293a461636d65a9726561645f696f70730393a461636d65b3636c"
        "69656e745f6567726573735f627974657301c41007000000000000000100000000000000c41003000000"
        "0000000000feffffffffffffc41004000000000000000000000000000000c41005000000000000000100"
        "000000000000",
    ),
    (
        SnapshotBatch.of(
            "o1",
            5,
            (RateSnapshot(K, 5, 9, 120, 10**12, 7, 2, 3, 250_000, 4),),
            (Rejection(KB, RejectReason.NOT_OWNER, 6),),
            batch_seq=11,
        ),
        "dc001003a9736e617073686f7473a26f310503cf000000e8d4a510009193a461636d65a9726561645f69"
        "6f707303c4080500000000000000c4080900000000000000c4087800000000000000c408070000000000"
        "0000c4080200000000000000c40890d0030000000000c4080400000000000000919393a461636d65b363"
        "6c69656e745f6567726573735f627974657301a96e6f745f6f776e6572060b",
    ),
    (
        Handover(
            "o1",
            5,
            (
                KeyHandover(
                    K, 1500, 5, 9, (ReporterWatermark("w1", 2, 7), ReporterWatermark("w2", 0, 3))
                ),
                KeyHandover(KB, 0, 5, 1),
            ),
        ),
        "9503a868616e646f766572a26f3105929593a461636d65a9726561645f696f707303cd05dc0509929"
        "3a27731020793a2773200039593a461636d65b3636c69656e745f6567726573735f6279746573010005"
        "0190",
    ),
]


PINNED: list[tuple[Any, str]] = [
    (
        dataclasses.replace(PREVIOUS[0][0], heard_batch=9, since_ages=(3, 0)),
        "9c03a77265706f727473a2773105029293a461636d65a9726561645f696f70730393a461636d65b3636c"
        "69656e745f6567726573735f627974657301c41007000000000000000100000000000000c41003000000"
        "0000000000feffffffffffffc41004000000000000000000000000000000c41005000000000000000100"
        "00000000000009c41003000000000000000000000000000000",
    ),
    (
        dataclasses.replace(
            PREVIOUS[1][0], floors_ppm=(125_000,), applied_above=(5,), applied_net=(40,)
        ),
        "dc001303a9736e617073686f7473a26f310503cf000000e8d4a510009193a461636d65a9726561645f69"
        "6f707303c4080500000000000000c4080900000000000000c4087800000000000000c408070000000000"
        "0000c4080200000000000000c40890d0030000000000c4080400000000000000919393a461636d65b363"
        "6c69656e745f6567726573735f627974657301a96e6f745f6f776e6572060bc40848e8010000000000c4"
        "080500000000000000c4082800000000000000",
    ),
    PREVIOUS[2],
]

# The snapshot batch of the release before `applied_above` (17 fields, with `floors_ppm`):
# still decoded, with `applied_above` empty.
BEFORE_ABOVE = (
    dataclasses.replace(PREVIOUS[1][0], floors_ppm=(125_000,)),
    "dc001103a9736e617073686f7473a26f310503cf000000e8d4a510009193a461636d65a9726561645f69"
    "6f707303c4080500000000000000c4080900000000000000c4087800000000000000c408070000000000"
    "0000c4080200000000000000c40890d0030000000000c4080400000000000000919393a461636d65b363"
    "6c69656e745f6567726573735f627974657301a96e6f745f6f776e6572060bc40848e8010000000000",
)


# The snapshot batch of the release before `applied_net` (18 fields): still decoded, with
# `applied_net` empty (the worker's estimate then counts as it did before it).
BEFORE_NET = (
    dataclasses.replace(PREVIOUS[1][0], floors_ppm=(125_000,), applied_above=(5,)),
    "dc001203a9736e617073686f7473a26f310503cf000000e8d4a510009193a461636d65a9726561645f696f"
    "707303c4080500000000000000c4080900000000000000c4087800000000000000c4080700000000000000"
    "c4080200000000000000c40890d0030000000000c4080400000000000000919393a461636d65b3636c6965"
    "6e745f6567726573735f627974657301a96e6f745f6f776e6572060bc40848e8010000000000c408050000"
    "0000000000",
)


def test_a_snapshot_batch_without_applied_net_still_decodes() -> None:
    msg, wire = BEFORE_NET
    assert decode(bytes.fromhex(wire)) == msg
    assert msg.applied_net == ()


def test_a_bad_applied_net_column_is_refused() -> None:
    wire = to_wire(PINNED[1][0])
    wire[18] = pack_column([-1])
    with pytest.raises(MessageError, match="applied_net"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire[18] = pack_column([1, 2])
    with pytest.raises(MessageError, match="applied_net"):
        decode(msgpack.packb(wire, use_bin_type=True))


def test_a_snapshot_batch_without_applied_above_still_decodes() -> None:
    msg, wire = BEFORE_ABOVE
    assert decode(bytes.fromhex(wire)) == msg
    assert msg.applied_above == ()


def test_a_bad_applied_above_column_is_refused() -> None:
    wire = to_wire(PINNED[1][0])
    wire[17] = pack_column([-1])
    with pytest.raises(MessageError, match="applied_above"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire[17] = pack_column([1, 2])
    with pytest.raises(MessageError, match="applied_above"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire[17] = pack_column([1 << ABOVE_BITS])
    with pytest.raises(MessageError, match="applied_above"):
        decode(msgpack.packb(wire, use_bin_type=True))


def test_above_mask_and_above_applied_agree() -> None:
    """The owner's bits for the sequences it applied past the gap after its watermark, and
    the receiver's reading of them: the gap itself and sequences at or below the
    watermark are never said, nor are those beyond ABOVE_BITS."""
    watermark = 10
    above = {12, 14, 13 + ABOVE_BITS}
    mask = above_mask(watermark, above)
    said = [s for s in range(0, 12 + 2 * ABOVE_BITS) if above_applied(mask, watermark, s)]
    assert said == [12, 14]
    assert above_mask(watermark, ()) == 0
    assert 0 <= above_mask(watermark, range(12, 12 + ABOVE_BITS)) < 1 << ABOVE_BITS


@pytest.mark.parametrize("msg, wire", PINNED, ids=["reports", "snapshots", "handover"])
def test_wire_format_is_pinned(msg: Message, wire: str) -> None:
    assert encode(msg).hex() == wire
    assert decode(bytes.fromhex(wire)) == msg


@pytest.mark.parametrize("msg, wire", PREVIOUS[:2], ids=["reports", "snapshots"])
def test_the_shape_before_the_last_fields_still_decodes(msg: Message, wire: str) -> None:
    """A peer one release behind sends no `heard_batch`, `since_ages` or `floors_ppm`:
    read as 0 and none."""
    assert decode(bytes.fromhex(wire)) == msg
    assert encode(msg).hex() != wire  # what we send carries them


def _every_kind() -> list[Message]:
    return [
        PINNED[0][0],
        PINNED[1][0],
        PREVIOUS[2][0],
        CellPublish("w1", 5, (Cell(K, 3, 40),)),
        CellFold("o1", 5, (FoldRow(K, 3, 90, 40),)),
        CooldownReport("w1", 5, (CooldownRow(K, 250),)),
        CooldownNotice("o1", 5, (CooldownRow(K, 250),)),
    ]


def _appended(wire: list[Any], extra: list[Any]) -> list[Any]:
    """`wire` as a newer peer would send it: `extra` after the last field, and after the
    last field of every row of its row arrays (a handover's keys and watermarks, cells,
    fold and cooldown rows, rejections)."""
    out = list(wire)
    if out[1] == "snapshots":
        out[14] = [[*r, *extra] for r in out[14]]
    if out[1] == "handover":
        out[4] = [[*k[:4], [[*w, *extra] for w in k[4]], *extra] for k in out[4]]
    if out[1] in ("cells", "folds", "cooldown", "cooldown_left"):
        out[4] = [[*r, *extra] for r in out[4]]
    return out + extra


@pytest.mark.parametrize("msg", _every_kind(), ids=lambda m: type(m).__name__)
def test_fields_a_newer_peer_appends_are_skipped(msg: Message) -> None:
    """A newer release appends fields and columns (docs/upgrade.md): this one decodes the
    message it knows from such a message, whatever the appended fields hold."""
    extra: list[Any] = [pack_column([1, 2, 3]), "a new field", [1, [2]], None]
    assert decode(msgpack.packb(_appended(to_wire(msg), extra), use_bin_type=True)) == msg
    most = [0] * _codec.EXTRA_FIELDS_MAX
    assert decode(msgpack.packb(_appended(to_wire(msg), most), use_bin_type=True)) == msg


@pytest.mark.parametrize("msg", _every_kind(), ids=lambda m: type(m).__name__)
def test_more_appended_fields_than_the_bound_are_refused(msg: Message) -> None:
    wire = to_wire(msg) + [0] * (_codec.EXTRA_FIELDS_MAX + 1)
    with pytest.raises(MessageError, match="fields"):
        decode(msgpack.packb(wire, use_bin_type=True))
    if isinstance(msg, ReportBatch):
        return  # a report batch has no row arrays
    rows = _appended(to_wire(msg), [0] * (_codec.EXTRA_FIELDS_MAX + 1))[: len(to_wire(msg))]
    with pytest.raises(MessageError, match="fields"):
        decode(msgpack.packb(rows, use_bin_type=True))


def test_known_fields_are_still_checked_beside_appended_ones() -> None:
    """Skipping what a newer peer appended does not loosen anything this release knows."""
    wire = to_wire(PINNED[1][0]) + [b"new"]
    wire[17] = pack_column([-1])
    with pytest.raises(MessageError, match="applied_above"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire = to_wire(PINNED[0][0]) + [b"new"]
    wire[6] = pack_column([0, 1])
    with pytest.raises(MessageError, match=r"sequences\[0\]"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire = _appended(to_wire(PREVIOUS[2][0]), ["new"])
    wire[4][0][4][0][2] = -1
    with pytest.raises(MessageError, match="watermark"):
        decode(msgpack.packb(wire, use_bin_type=True))


def test_a_bad_since_ages_column_is_refused() -> None:
    wire = to_wire(PINNED[0][0])
    wire[11] = pack_column([-1, 0])
    with pytest.raises(MessageError, match="since_ages"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire[11] = pack_column([1])
    with pytest.raises(MessageError, match="since_ages"):
        decode(msgpack.packb(wire, use_bin_type=True))
    with pytest.raises(MessageError, match="heard_batch"):
        decode(msgpack.packb(to_wire(PINNED[0][0])[:10] + [-1, b""], use_bin_type=True))


def test_a_bad_floors_column_is_refused() -> None:
    wire = to_wire(PINNED[1][0])
    wire[16] = pack_column([PPM + 1])
    with pytest.raises(MessageError, match="floors_ppm"):
        decode(msgpack.packb(wire, use_bin_type=True))
    wire[16] = pack_column([1, 2])
    with pytest.raises(MessageError, match="floors_ppm"):
        decode(msgpack.packb(wire, use_bin_type=True))


def test_key_cache_stays_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "_KEY_CACHE_MAX", 8)
    monkeypatch.setattr(_codec, "_KEY_CACHE", {})
    for gen in range(1, 30):
        batch = ReportBatch.of(
            "w1", 5, (UsageReport(RateKey("t", Metric.READ_IOPS, gen), "w1", 2, 1),)
        )
        assert decode(encode(batch)) == batch
        assert 0 < len(_codec._KEY_CACHE) <= 8


def test_rows_and_columns_agree() -> None:
    rows = (
        UsageReport(K, "w1", 2, 7, iops_delta=3, denied_delta=4, unacked_from=5),
        UsageReport(KB, "w1", 2, 1, byte_delta=-512),
    )
    batch = ReportBatch.of("w1", 5, rows)
    assert batch.reports == rows and len(batch) == 2
    assert batch.keys == (K, KB) and batch.deltas == (3, -512) and batch.unacked_from == (5, 1)
    snap = RateSnapshot(K, 5, 9, 120, 10**12, 7, 2, 3, 250_000, 4)
    assert SnapshotBatch.of("o1", 5, (snap,)).snapshots == (snap,)


@given(
    n=st.integers(0, 12),
    ages=st.booleans(),
    pick=st.one_of(
        st.tuples(st.integers(0, 12), st.integers(0, 12)).map(lambda ab: slice(*sorted(ab))),
        st.sets(st.integers(0, 11)).map(sorted),
    ),
)
def test_a_batch_cut_or_deduplicated_keeps_its_rows_and_floor_anchors(
    n: int, ages: bool, pick: slice | list[int]
) -> None:
    """`ReportBatch.rows` (the node's slices and resend filter): the picked rows of every
    column, in order, and what the batch says once; a sliced batch once lost `heard_batch`
    and `since_ages`, the anchors of the owner's escrow (docs/partitions.md)."""
    keys = tuple(RateKey(f"t{i}", Metric.READ_IOPS, 1) for i in range(n))
    idx = range(n)[pick] if isinstance(pick, slice) else [i for i in pick if i < n]
    batch = ReportBatch(
        "w1",
        5,
        2,
        keys,
        tuple(range(10, 10 + n)),
        tuple(range(-n, 0)),
        tuple(range(n)),
        tuple(range(1, 1 + n)),
        heard_batch=7,
        since_ages=tuple(range(100, 100 + n)) if ages else (),
    )
    part = batch.rows(pick if isinstance(pick, slice) else list(idx))
    assert part == dataclasses.replace(
        batch,
        keys=tuple(keys[i] for i in idx),
        sequences=tuple(10 + i for i in idx),
        deltas=tuple(i - n for i in idx),
        denied=tuple(idx),
        unacked_from=tuple(1 + i for i in idx),
        since_ages=tuple(100 + i for i in idx) if ages else (),
    )


def test_rows_of_two_incarnations_do_not_make_one_batch() -> None:
    with pytest.raises(MessageError) as info:
        ReportBatch.of("w1", 5, (UsageReport(K, "w1", 2, 7), UsageReport(KB, "w1", 3, 1)))
    assert info.value.field == "reports[1].worker_epoch"
    with pytest.raises(MessageError) as info:
        ReportBatch.of("w1", 5, (UsageReport(K, "w2", 2, 7),))
    assert info.value.field == "reports[0].worker_id"


def mutate(wire: list[Any], path: tuple[int, ...], value: Any) -> list[Any]:
    import copy

    w = copy.deepcopy([list(x) if isinstance(x, tuple) else x for x in wire])
    target = w
    for i in path[:-1]:
        if isinstance(target[i], tuple):
            target[i] = [list(x) if isinstance(x, tuple) else x for x in target[i]]
        target = target[i]
    target[path[-1]] = value
    return w


def col(*values: int) -> bytes:
    return pack_column(list(values))


@pytest.mark.parametrize(
    "path, value, field",
    [
        ((0,), 1, "schema"),
        ((0,), 2.0, "schema"),
        ((1,), "bogus", "kind"),
        ((2,), "", "sender"),
        ((3,), -1, "ring_epoch"),
        ((4,), "2", "worker_epoch"),
        ((5, 0, 1), "Read-Ops", "keys[0].metric"),
        ((5, 0, 2), 0, "keys[0].policy_generation"),
        ((5, 0, 2), 3.0, "keys[0].policy_generation"),  # equal to a cached key's 3: still refused
        ((5, 0, 2), True, "keys[0].policy_generation"),
        ((5, 0), [1, 2], "keys[0]"),
        ((5,), "nope", "keys"),
        ((6,), col(0, 1), "sequences[0]"),
        ((6,), col(7), "sequences"),  # one value for two keys
        ((6,), [7, 1], "sequences"),  # not packed
        ((8,), col(-1, 0), "denied[0]"),
        ((9,), col(8, 1), "unacked_from[0]"),  # above its own sequence
        ((7,), b"\x00" * 15, "deltas"),  # not whole int64s
    ],
)
def test_bad_report_batch_names_the_field(path: tuple[int, ...], value: Any, field: str) -> None:
    decode(encode(reports()))  # the keys are now in the decoder's cache
    wire = mutate(to_wire(reports()), path, value)
    with pytest.raises(MessageError) as info:
        decode(msgpack.packb(wire))
    assert info.value.field == field, info.value


@pytest.mark.parametrize(
    "path, value, field",
    [
        ((13,), col(0), "active_reporters[0]"),
        ((12,), col(1_000_001), "shares_ppm[0]"),
        ((9,), col(-5), "remaining[0]"),
        ((5,), -1, "observed_at"),
        ((14, 0, 1), "gone", "rejections[0].reason"),
        ((14, 0), [1], "rejections[0]"),
    ],
)
def test_bad_snapshot_batch_names_the_field(path: tuple[int, ...], value: Any, field: str) -> None:
    wire = mutate(to_wire(snapshots()), path, value)
    with pytest.raises(MessageError) as info:
        decode(msgpack.packb(wire))
    assert info.value.field == field, info.value


def test_size_limits() -> None:
    data = encode(reports())
    with pytest.raises(MessageError, match="exceeds"):
        decode(data, max_bytes=len(data) - 1)
    n = REPORT_ROWS_MAX + 1  # the most reports a peer may send in one batch
    with pytest.raises(MessageError, match=f"at most {REPORT_ROWS_MAX}"):
        from_wire(
            [SCHEMA_VERSION, "reports", "w", 0, 0, [["t", "read_iops", 1]] * n, *[col(1) * n] * 4]
        )
    rows = [UsageReport(RateKey(f"t{i}", Metric.READ_IOPS, 1), "w", 1, 1, 1) for i in range(n)]
    with pytest.raises(MessageError, match="keys: at most 256 reports per batch"):
        ReportBatch.of("w", 0, rows)
    batch = decode(encode(ReportBatch.of("w", 0, rows[:-1])))
    assert isinstance(batch, ReportBatch) and len(batch) == REPORT_ROWS_MAX
    with pytest.raises(ConfigError, match=f"report_batch_max: must be <= {REPORT_ROWS_MAX}"):
        CoreConfig(report_batch_max=REPORT_ROWS_MAX + 1)


def test_types_are_type_errors() -> None:
    with pytest.raises(MessageTypeError):
        decode("a string")  # type: ignore[arg-type]
    with pytest.raises(MessageTypeError):
        UsageReport(K, "w", "1", 1)  # type: ignore[arg-type]


wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


@given(st.binary(max_size=256))
def test_random_bytes_only_ever_raise_message_errors(data: bytes) -> None:
    try:
        decode(data)
    except MessageError:
        pass


@pytest.mark.slow
@given(
    st.one_of(
        wire_values,
        st.builds(
            lambda rest: [SCHEMA_VERSION, "reports", *rest],
            st.lists(wire_values, min_size=8, max_size=8),
        ),
        st.builds(
            lambda rest: [SCHEMA_VERSION, "snapshots", *rest],
            st.lists(wire_values, min_size=14, max_size=14),
        ),
    )
)
def test_random_structures_only_ever_raise_message_errors(obj: Any) -> None:
    try:
        decode(msgpack.packb(obj))
    except MessageError:
        pass


class _CheckingFleet(MemoryFleet):
    """Every message the cores send (built with `trusted`, unchecked) must pass the full
    checks and survive the codec unchanged."""

    checked = 0

    def _send(self, src: str, dst: str, msg: Message) -> None:
        fields = [getattr(msg, name) for name in type(msg).__slots__]
        assert type(msg)(*fields) == msg  # __post_init__ validates every element
        assert decode(encode(msg)) == msg
        self.checked += 1
        super()._send(src, dst, msg)


@pytest.mark.parametrize("seed", [1, 2])
def test_what_the_cores_build_unchecked_passes_every_check(seed: int) -> None:
    f = _CheckingFleet(
        ["w0", "w1", "w2"],
        cache(policy("t", rate=1000, burst=100, b=10), policy("u", rate=50, burst=5, b=2)),
        seed=seed,
        loss=0.05,
        duplicate=0.05,
    )
    drive(f, [Offered("t", 3000), Offered("u", 20)], NS_PER_S)
    assert f.checked > 100
