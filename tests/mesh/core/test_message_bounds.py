"""Snapshot batches and hand-overs have wire bounds whose processing fits well under 1 ms,
and senders split into several messages rather than produce one a receiver
refuses."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mesh.core.config import CoreConfig
from mesh.core.effects import Send
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import (
    HANDOVER_ROWS_MAX,
    HANDOVER_WATERMARKS_MAX,
    SNAPSHOT_ROWS_MAX,
    Handover,
    KeyHandover,
    Rejection,
    RejectReason,
    ReportBatch,
    ReporterWatermark,
    SnapshotBatch,
    decode,
    encode,
    from_wire,
    to_wire,
)
from mesh.core.owner import Owner
from mesh.core.owner._handover import PENDING_MAX
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from mesh.errors import ConfigError, MessageError
from tests.mesh._helpers import MS, cache, owned_keys, policy

ANY = policy("*", rate=10**6, burst=10**6, b=10**3)
RING = Ring(["o", "w", "w2"], 1)  # the owner and its two reporters, all members
NOW = 10_000 * MS


def keys_of(ring: Ring, member: str, n: int, prefix: str = "k") -> list[RateKey]:
    return owned_keys(ring, member, n, prefix)


def reports(sender: str, keys: list[RateKey], seq: int = 1) -> ReportBatch:
    n = len(keys)
    return ReportBatch(sender, 1, 1, tuple(keys), (seq,) * n, (1,) * n, (0,) * n, (seq,) * n)


def sent_snapshots(effects: Sequence[object]) -> list[tuple[str, SnapshotBatch]]:
    out = []
    for e in effects:
        assert isinstance(e, Send)
        assert isinstance(e.message, SnapshotBatch)
        out.append((e.to, e.message))
    return out


def test_an_owner_with_many_keys_for_one_worker_sends_batches_within_the_bound() -> None:
    """2,000 keys reported by two workers, some rows of each batch not the owner's (they
    come back as rejections beside the snapshots): every batch, replies and the tick's
    refreshes, holds at most SNAPSHOT_ROWS_MAX rows and rejections and decodes at the
    receiver; every key reaches both workers."""
    o = Owner("o", RING, cache(ANY), 0)
    mine = keys_of(RING, "o", 2000)
    theirs = keys_of(RING, "w", 2000 // 255 + 1, prefix="x")
    step = 255  # plus one key the owner refuses: a full batch of 256 rows
    effects = []
    for worker in ("w", "w2"):
        for i in range(0, len(mine), step):
            batch = [*mine[i : i + step], theirs[i // step]]
            effects += o.receive(NOW, reports(worker, batch))
    effects += o.tick(NOW + 6 * MS)
    seen: dict[str, set[RateKey]] = {"w": set(), "w2": set()}
    rejected = 0
    for to, msg in sent_snapshots(effects):
        assert len(msg.keys) + len(msg.rejections) <= SNAPSHOT_ROWS_MAX
        back = decode(encode(msg))  # the receiver takes it
        assert isinstance(back, SnapshotBatch)
        seen[to] |= set(msg.keys)
        rejected += sum(r.reason is RejectReason.NOT_OWNER for r in msg.rejections)
    assert seen["w"] == seen["w2"] == set(mine)
    assert rejected == 2 * len(theirs)


def test_rows_and_rejections_together_are_split_at_the_bound() -> None:
    """A reply with pending rows and rejections past the bound goes as two batches."""
    cfg = CoreConfig(snapshot_batch_max=4)
    o = Owner("o", RING, cache(ANY), 0, config=cfg)
    batch = [*keys_of(RING, "o", 3), *keys_of(RING, "w", 3, prefix="x")]
    msgs = [m for _, m in sent_snapshots(o.receive(NOW, reports("w", batch)))]
    assert [len(m.keys) + len(m.rejections) for m in msgs] == [4, 2]
    assert sum(len(m.keys) for m in msgs) == 3 and sum(len(m.rejections) for m in msgs) == 3
    with pytest.raises(ConfigError, match=f"snapshot_batch_max: must be <= {SNAPSHOT_ROWS_MAX}"):
        CoreConfig(snapshot_batch_max=SNAPSHOT_ROWS_MAX + 1)


def snapshot_batch(
    keys: tuple[RateKey, ...], rejections: tuple[Rejection, ...] = ()
) -> SnapshotBatch:
    one = (1,) * len(keys)
    return SnapshotBatch.trusted("o", 1, 0, 0, keys, one, one, one, one, one, one, one, rejections)


def test_a_snapshot_batch_past_the_bound_is_refused_by_name() -> None:
    n = SNAPSHOT_ROWS_MAX + 1
    keys = tuple(RateKey(f"t{i}", Metric.READ_IOPS, 1) for i in range(n))
    ok = snapshot_batch(keys[:-1])
    assert decode(encode(ok)) == ok
    with pytest.raises(MessageError, match=f"keys: at most {SNAPSHOT_ROWS_MAX}"):
        decode(encode(snapshot_batch(keys)))
    rej = tuple(Rejection(k, RejectReason.NOT_OWNER, 1) for k in keys[:2])
    with pytest.raises(MessageError, match="snapshots and rejections per batch"):
        from_wire(to_wire(snapshot_batch(keys[:-2], rej)))


def test_a_handover_past_the_bound_is_refused_by_name_in_keys_and_watermarks() -> None:
    keys = [RateKey(f"t{i}", Metric.READ_IOPS, 1) for i in range(HANDOVER_ROWS_MAX + 1)]
    items = tuple(KeyHandover(k, 0, 1, 1) for k in keys)
    Handover("c", 1, items[:-1])  # the bound itself is legal
    with pytest.raises(MessageError, match=f"keys: at most {HANDOVER_ROWS_MAX}"):
        Handover("c", 1, items)
    marks = tuple(ReporterWatermark(f"w{j}", 1, 1) for j in range(2))
    two = (KeyHandover(keys[0], 0, 1, 1, marks), *items[1 : HANDOVER_ROWS_MAX - 1])
    with pytest.raises(MessageError, match="keys and watermarks per message"):
        Handover("c", 1, two)
    wire = to_wire(Handover("c", 1, items[:-1]))
    wire[4][0][4] = [[f"w{j}", 1, 1] for j in range(2)]  # one key's records push it over
    with pytest.raises(MessageError, match="keys and watermarks per message"):
        from_wire(wire)
    assert HANDOVER_WATERMARKS_MAX == HANDOVER_ROWS_MAX - 1


def test_a_handover_of_100000_keys_is_split_within_the_bound_and_fully_taken() -> None:
    """Keys and their watermark, two rows each, 64 keys a message; both next owners park
    every key they are sent (each fewer than PENDING_MAX)."""
    ring = Ring(["a", "b", "c"], 1)
    leaver = Owner("c", ring, cache(ANY), 0)
    keys = keys_of(ring, "c", 100_000)
    for i in range(0, len(keys), 256):
        leaver.receive(NOW, reports("a", keys[i : i + 256]))
    assert len(leaver.keys) == 100_000
    takers = {m: Owner(m, ring, cache(ANY), 0) for m in ("a", "b")}
    msgs = leaver.hand_over(NOW + MS, Ring(["a", "b"], 1))
    assert len(msgs) >= 100_000 // (HANDOVER_ROWS_MAX // 2)
    for e in msgs:
        assert isinstance(e, Send) and isinstance(e.message, Handover)
        assert sum(1 + len(k.watermarks) for k in e.message.keys) <= HANDOVER_ROWS_MAX
        back = decode(encode(e.message))
        assert isinstance(back, Handover)
        takers[e.to].take_handover(5 * NS_PER_S, back)
    assert sum(len(t.handovers.pending) for t in takers.values()) == 100_000
    for t in takers.values():
        assert t.refused_n == 0 and t.handovers.ignored == {"sender": 0, "not_owner": 0}


def test_parking_past_its_bound_evicts_the_oldest_in_constant_time() -> None:
    h = Owner("a", Ring(["a"], 1), cache(ANY), 0).handovers
    keys = [RateKey(f"p{i}", Metric.READ_IOPS, 1) for i in range(PENDING_MAX + 3)]
    for i, k in enumerate(keys):
        h.park(i, KeyHandover(k, 0, 1, 1))
    assert len(h.pending) == PENDING_MAX and h.expired == 3
    assert keys[2] not in h.pending and keys[3] in h.pending
    h.park(PENDING_MAX + 4, KeyHandover(keys[3], 0, 1, 1))  # again: now the newest
    h.park(PENDING_MAX + 5, KeyHandover(RateKey("q", Metric.READ_IOPS, 1), 0, 1, 1))
    assert keys[3] in h.pending and keys[4] not in h.pending


def test_a_key_with_more_reporters_than_fit_hands_over_the_most_recent() -> None:
    members = ["c", *(f"w{i:03}" for i in range(HANDOVER_WATERMARKS_MAX + 10))]
    ring = Ring(["a", *members], 1)
    leaver = Owner("c", ring, cache(ANY), 0)
    key = keys_of(ring, "c", 1)[0]
    for i, w in enumerate(members[1:]):
        leaver.receive(NOW + i * MS, reports(w, [key]))
    without = Ring([m for m in ring.members if m != "c"], 2)
    (msg,) = [e.message for e in leaver.hand_over(NOW + NS_PER_S, without) if isinstance(e, Send)]
    assert isinstance(msg, Handover)
    (item,) = msg.keys
    assert len(item.watermarks) == HANDOVER_WATERMARKS_MAX
    assert {m.worker_id for m in item.watermarks} == set(members[-HANDOVER_WATERMARKS_MAX:])
