"""`mesh policy preview`'s formula against a model written apart from it: a token bucket
stepped through the window in exact fractions, fed each tenant's offered traffic evenly
(docs/operations-policy.md, "Previewing a change")."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.cli._policydiff import compute_diff
from mesh.cli._preview import Observed, capacity_units, observe, preview
from mesh.core.policy import TenantRatePolicy
from ratemesh.errors import ConfigError

STEPS = 200  # model steps per window


def _bucket_admits(offered: int, rate: Fraction, burst: int, window_s: Fraction) -> Fraction:
    """A bucket full at the start, refilled at `rate`, fed `offered` units evenly over the
    window in STEPS steps, refill and arrivals both even within a step: what it admits
    (fluid units, exact)."""
    level = Fraction(burst)
    refill = rate * window_s / STEPS
    arriving = Fraction(offered, STEPS)
    admitted = Fraction(0)
    for _ in range(STEPS):
        take = min(arriving, level + refill)
        level = min(Fraction(burst), level + refill - take)
        admitted += take
    return admitted


def _p(tenant: str, rate: int, burst: int, mode: str = "global", **kw: object) -> TenantRatePolicy:
    return TenantRatePolicy(tenant, "read_iops", 1, rate, burst, 1, mode=mode, **kw)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    offered=st.integers(0, 5_000),
    rate=st.integers(1, 400),
    burst=st.integers(1, 200),
    window_s=st.sampled_from([1, 2, 5]),
)
def test_would_admit_is_the_bucket_model_within_a_unit(
    offered: int, rate: int, burst: int, window_s: int
) -> None:
    """The preview's min(offered, R x window + B) is the bucket's answer for even traffic,
    rounded down to whole units."""
    rows = preview(
        [_p("a", 10_000, 10_000)],
        [_p("a", rate, burst)],
        {("a", "read_iops"): Observed(offered, offered, 0)},
        window_s,
        3,
    )
    (row,) = rows
    model = _bucket_admits(offered, Fraction(rate), burst, Fraction(window_s))
    assert row.would_admit + row.would_deny == offered == row.offered
    assert row.would_admit == int(model), (
        f"offered {offered} R {rate} B {burst} window {window_s}: {row} against {model}"
    )


@settings(max_examples=100, deadline=None)
@given(
    admitted=st.integers(0, 1_000),
    calls=st.integers(0, 1_000),
    denied=st.integers(0, 1_000),
    members=st.integers(1, 5),
    rates=st.tuples(st.integers(1, 300), st.integers(1, 300)),
)
def test_raising_a_limit_never_admits_less_and_local_is_per_member(
    admitted: int, calls: int, denied: int, members: int, rates: tuple[int, int]
) -> None:
    low, high = sorted(rates)
    seen = {("a", "read_iops"): Observed(admitted, calls, denied)}
    cur = [_p("a", 1, 1)]
    rows = [preview(cur, [_p("a", r, 10)], seen, 2, members) for r in (low, high)]
    if low != 1:
        assert rows[0][0].would_admit <= rows[1][0].would_admit
    local = preview(cur, [_p("a", low, 10, mode="local")], seen, 2, members)[0]
    assert capacity_units(local.new, 2, members) == members * (2 * low + 10)
    assert local.would_admit == min(local.offered, members * (2 * low + 10))
    per_call = Fraction(admitted, calls) if calls else Fraction(1)
    assert local.offered == admitted + (-(-denied * per_call // 1) if denied else 0)


def test_a_default_policy_change_reaches_every_tenant_under_it_and_no_other() -> None:
    cur = [_p("*", 100, 10), _p("own", 100, 10)]
    new = [_p("*", 20, 5)]
    seen = {
        ("x", "read_iops"): Observed(300, 300, 0),
        ("own", "read_iops"): Observed(300, 300, 0),
    }
    rows = preview(cur, new, seen, 1, 1)
    assert [(r.tenant, r.admitted_now, r.would_admit, r.would_deny) for r in rows] == [
        ("x", 300, 25, 275)
    ]


def test_unchanged_values_shadow_and_removed_limits() -> None:
    seen = {("a", "read_iops"): Observed(50, 50, 50)}  # 50 denied calls of 1 unit
    same = preview([_p("a", 10, 5)], [_p("a", 10, 5)], seen, 1, 1)
    assert same == []
    shadow = preview([_p("a", 10, 5)], [_p("a", 10, 5, posture="shadow")], seen, 1, 1)
    assert [(r.offered, r.would_admit, r.would_deny) for r in shadow] == [(100, 100, 0)]
    gone = preview([_p("a", 10, 5)], [_p("a", 10, 5, enabled=False)], seen, 1, 1)
    assert gone[0].would_deny == 0


def test_observe_sums_member_differences_and_reads_a_fall_as_a_restart() -> None:
    def row(units: int, calls: int, denied: int) -> dict[str, Any]:
        return {
            "tenant": "a",
            "metric": "read_iops",
            "admitted_units": units,
            "admitted_calls": calls,
            "denied_calls": denied,
        }

    before = [[row(100, 100, 5)], [row(40, 40, 0)], []]
    after = [[row(160, 160, 9)], [row(7, 7, 1)], [row(3, 3, 0)]]
    assert observe(before, after) == {("a", "read_iops"): Observed(60 + 7 + 3, 70, 5)}


def test_a_window_of_zero_is_refused() -> None:
    with pytest.raises(ConfigError, match="window_s"):
        preview([], [], {}, 0, 1)


def test_a_posture_change_is_a_change_the_diff_names() -> None:
    was = _p("a", 10, 5)
    diff = compute_diff([(_p("a", 10, 5, posture="shadow"), False)], [was], {}, 1, prune=False)
    (change,) = diff.changes
    assert "posture enforce -> shadow" in change.line()
    assert change.to_json()["changes"] == {"posture": ["enforce", "shadow"]}
