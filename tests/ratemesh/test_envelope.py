"""The strict checker over a tree: each rated node's one-pass scan equals the brute-force
maximum over every interval of its subtree's admissions, and caps sum a subtree."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.telemetry import excess_over_times as mesh_excess
from ratemesh.envelope import Admission, cap_excess, excess_over_times, rate_excess

NS = 1_000_000_000
PARENT = {1: None, 2: 1, 3: 1, 4: 2}  # root 1 > tenants 2, 3 > task 4


def brute(items: list[tuple[int, int]], rate: float, burst: int) -> float:
    items = sorted(items)
    worst = float("-inf")
    for i in range(len(items)):
        for j in range(i, len(items)):
            span_s = (items[j][0] - items[i][0]) / NS
            worst = max(worst, sum(u for _, u in items[i : j + 1]) - rate * span_s - burst)
    return worst


def below(node: int, of: int) -> bool:
    cur: int | None = node
    while cur is not None:
        if cur == of:
            return True
        cur = PARENT[cur]
    return False


_ADMISSIONS = st.lists(
    st.tuples(st.integers(0, 10**9), st.sampled_from([1, 2, 3, 4]), st.integers(1, 5)),
    max_size=40,
)


@given(_ADMISSIONS, st.floats(0, 500, allow_nan=False), st.integers(0, 20))
def test_rate_excess_equals_every_interval_of_every_subtree(
    admissions: list[Admission], rate: float, burst: int
) -> None:
    rates = {1: (rate, burst), 2: (rate / 2, burst), 4: (rate, 0)}
    got = rate_excess(admissions, PARENT, rates)
    for node, (r, b) in rates.items():
        items = [(t, u) for t, n, u in admissions if below(n, node)]
        assert got[node] == pytest.approx(brute(items, r, b), abs=1e-6)


@given(_ADMISSIONS, st.integers(0, 100))
def test_cap_excess_sums_the_subtree(admissions: list[Admission], cap: int) -> None:
    got = cap_excess(admissions, PARENT, {1: cap, 2: cap, 3: cap})
    for node in (1, 2, 3):
        assert got[node] == sum(u for _, n, u in admissions if below(n, node)) - cap


def test_the_mesh_uses_the_same_formula() -> None:
    assert mesh_excess is excess_over_times


def test_a_cycle_in_the_tree_is_refused() -> None:
    with pytest.raises(ValueError, match="cycle"):
        cap_excess([(0, 1, 1)], {1: 2, 2: 1}, {1: 5})
