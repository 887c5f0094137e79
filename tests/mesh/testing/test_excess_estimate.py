"""A worker's excess estimate sees usage its owner acknowledged and did not apply.

Pattern 2 of the envelope work (traffic that moves from a member and comes back after an
idle past views_idle_ms), with its cause (pattern 5: the view made again numbered its
reports from 1, so the owner took them for duplicates, acknowledged them and applied
none) planted again: the fleet admits far above its limit, and the returning member's
`excess_estimate` must pass its `excess_bound` while it does. Without the bug, over the
same schedule with refunds, the estimate stays within the bound at every millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mesh.core.reporter import Reporter, excess_estimate
from tests.mesh.core.test_planted_bugs import _open_numbers_from_one, planted
from tests.mesh.testing.test_model_fleet import M, Schedule, T

R, B, b = 50, 10, 2


@dataclass
class Sampled(Schedule):
    """A schedule that reads every member's excess estimate of the key after each step,
    as a node computes it for its scrape (`excess_estimate`, d as the fleet's)."""

    worst: dict[str, float] = field(default_factory=dict)  # member -> max(estimate - bound)
    series: list[tuple[int, str, float, float]] = field(default_factory=list)
    admitted_before: int = 0  # admitted before the traffic came back

    def step(self, step_ns: int = 1_000_000) -> None:
        super().step(step_ns)
        f = self.fleet
        d_ns = f.propagation_delay_ns()
        for mid, m in f.members.items():
            for key, v in m.reporter.gates.items():
                if key.tenant_id != T or key.metric != M:
                    continue
                est, bound = excess_estimate(v, len(f.ring), d_ns)
                self.worst[mid] = max(self.worst.get(mid, -1e9), est - bound)
                self.series.append((f.now_ns, mid, est, bound))


def moving_traffic(seed: int, back_ms: int = 2000) -> Sampled:
    """180 offers/s through a for 1 s, through b for 1 s, an idle past views_idle_ms, and
    through a again for `back_ms`: the users' pattern 2 on the in-memory fleet."""
    s = Sampled(seed, R, B, b, ["a", "b", "c"], idle_ms=400)
    s.serve(["a"], 180, 1000, [1])
    s.serve(["b"], 180, 1000, [1])
    s.idle(900)  # past views_idle_ms: a's view is forgotten
    s.worst.clear()
    s.admitted_before = s.admitted
    s.serve(["a"], 180, back_ms, [1])
    return s


def test_reports_taken_for_duplicates_show_as_excess_above_the_bound() -> None:
    for seed in (1, 2, 3):
        with planted(Reporter, "open_gate", _open_numbers_from_one):
            bad = moving_traffic(seed)
        over = bad.admitted - bad.admitted_before
        assert over > R * 2 + B + 3 * b + 5, (seed, over)  # the fleet over-admits...
        assert bad.worst["a"] > 0, (seed, bad.worst)  # ...and a's estimate says so
        good = moving_traffic(seed)
        assert good.check() == [], (seed, good.check())
        assert max(good.worst.values()) <= 0, (seed, good.worst)
