"""The consistent-hash ring: stable placement, epochs, and ~1/N movement per change."""

from __future__ import annotations

import pytest

from mesh.core.policy import Metric, RateKey
from mesh.core.reporter._gate import Inflight
from mesh.core.ring import Ring
from mesh.errors import ConfigError
from tests.mesh._helpers import policy

KEYS = [
    RateKey(f"tenant-{i}", m, 1)
    for i in range(3000)
    for m in (Metric.READ_IOPS, Metric.CLIENT_EGRESS_BYTES)
]


def owners(ring: Ring) -> dict[RateKey, str]:
    return {k: ring.owner_of(k) for k in KEYS}


@pytest.mark.parametrize("n", [3, 5, 10, 20])
def test_adding_one_member_moves_about_one_nth(n: int) -> None:
    ring = Ring([f"m{i}" for i in range(n)], 1)
    grown = ring.with_members(list(ring.members) + ["new"])
    before, after = owners(ring), owners(grown)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "new" for k in moved)  # keys only move to the joiner
    assert 0.5 / (n + 1) <= len(moved) / len(KEYS) <= 1.6 / (n + 1)


@pytest.mark.parametrize("n", [3, 10])
def test_removing_one_member_moves_only_its_keys(n: int) -> None:
    ring = Ring([f"m{i}" for i in range(n)], 1)
    shrunk = ring.with_members([m for m in ring.members if m != "m1"])
    before, after = owners(ring), owners(shrunk)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert {before[k] for k in moved} == {"m1"}
    assert 0.5 / n <= len(moved) / len(KEYS) <= 1.6 / n


def test_placement_is_a_pure_function_of_members() -> None:
    a = Ring(["x", "y", "z"], 1)
    b = Ring(["z", "x", "y"], 7)
    assert owners(a) == owners(b)


def test_epoch_and_ownership_checks() -> None:
    ring = Ring(["a", "b"], 4)
    key = KEYS[0]
    owner = ring.owner_of(key)
    other = "a" if owner == "b" else "b"
    assert ring.owns(owner, key) and ring.owns(owner, key, 4)
    assert not ring.owns(owner, key, 3)  # a message routed by another ring
    assert not ring.owns(other, key)
    with pytest.raises(ConfigError, match="epoch"):
        ring.with_members(["a"], epoch=4)
    nxt = ring.with_members(["a"])
    assert nxt.epoch == 5 and nxt.owner_of(key) == "a"


def test_empty_ring_has_no_owner() -> None:
    ring = Ring([], 0)
    with pytest.raises(ConfigError, match="no members"):
        ring.owner_of(KEYS[0])
    assert not ring.owns("a", KEYS[0])


@pytest.mark.parametrize(
    "members, epoch, field",
    [([""], 1, "member"), ([3], 1, "member"), (["a"], -1, "epoch"), (["a"], "1", "epoch")],
)
def test_bad_ring_arguments(members: list[object], epoch: object, field: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        Ring(members, epoch)  # type: ignore[arg-type]
    assert getattr(info.value, "field", None) == field


def test_a_new_epoch_of_the_same_members_resends_nothing() -> None:
    from mesh.core.reporter import Reporter

    a, b = Ring(["a", "b"], 1), Ring(["b", "a"], 2)
    assert a.places_like(b) and not a.places_like(Ring(["a", "b", "c"], 3))
    assert not a.places_like(Ring(["a", "b"], 3, vnodes=a.vnodes + 1))
    r = Reporter("a", 1, a)
    v = r.open_gate(policy("t"))
    v.inflight = [Inflight(1, 1, 0, 0)]
    v.inflight[0].sent_at_ns, v.inflight[0].sends = 5, 1
    r._unacked[v.key] = v
    r.ring_changed(b)  # an epoch bump (a dns slot): reports are where they should be
    assert r.ring is b and v.inflight[0].sent_at_ns == 5
    r.ring_changed(Ring(["a", "c"], 3))
    assert v.inflight[0].sent_at_ns == -1  # placement changed: route again, resend
