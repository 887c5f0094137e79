"""`mesh policy apply`'s diff, alone: which keys are added, changed, removed or unchanged, the
generation each gets, and the files it refuses before anything is pushed."""

from __future__ import annotations

from typing import Any

import pytest

from mesh.cli._policydiff import compute_diff
from mesh.core.policy import Metric, TenantRatePolicy
from mesh.errors import ConfigError

READ: str = Metric.READ_IOPS


def p(tenant: str = "acme", gen: int = 1, rate: int = 100, **kw: Any) -> TenantRatePolicy:
    return TenantRatePolicy(tenant, kw.pop("metric", READ), gen, rate, 10, 5, **kw)


def test_kinds_and_generations() -> None:
    current = [p("acme", 2), p("beta", 1), p("gone", 4)]
    last = {("acme", READ): 2, ("beta", READ): 1, ("gone", READ): 4, ("new", READ): 3}
    desired = [(p("acme", rate=300), False), (p("beta"), False), (p("new"), False)]
    diff = compute_diff(desired, current, last, 9, prune=False)
    assert [(c.kind, c.tenant_id, c.generation, c.base) for c in diff.changes] == [
        ("changed", "acme", 3, 2),
        ("added", "new", 4, 3),  # after a tombstone at 3
    ]
    assert diff.unchanged == 1 and diff.kept == ["gone/read_iops"]
    assert diff.changes[0].to_json()["changes"] == {"target_rate": [100, 300]}
    assert "generation 2 -> 3: target_rate 100 -> 300" in diff.changes[0].line()
    pruned = compute_diff(desired, current, last, 9, prune=True)
    assert [(c.kind, c.generation) for c in pruned.of("removed")] == [("removed", 5)]


def test_explicit_generations_are_checked_against_governord() -> None:
    current = [p("acme", 2)]
    last = {("acme", READ): 2}
    same = compute_diff([(p("acme", 2), True)], current, last, 1, prune=False)
    assert same.unchanged == 1 and not same.changes
    ahead = compute_diff([(p("acme", 7, rate=1), True)], current, last, 1, prune=False)
    assert [(c.kind, c.generation) for c in ahead.changes] == [("changed", 7)]
    with pytest.raises(ConfigError, match="current with other values.*as 3"):
        compute_diff([(p("acme", 2, rate=1), True)], current, last, 1, prune=False)
    with pytest.raises(ConfigError, match="not above governord's last \\(2\\)"):
        compute_diff([(p("acme", 1), True)], current, last, 1, prune=False)
