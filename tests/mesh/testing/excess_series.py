"""Pattern 2 on the in-memory fleet, and the excess estimate a node would export for it.

Traffic that moves from member a to member b and comes back to a after a's view was
forgotten idle (the users' pattern 2), optionally with its cause planted again (pattern
5: the view made again numbers its reports from 1, so the owner takes them for
duplicates). Every member's view of the key is read after each millisecond as a node
reads it for its scrape (`mesh.core.reporter.excess_estimate`, d as the fleet's), and a's
estimate and bound are sampled every SCRAPE_S as Prometheus would scrape them.

    python -m tests.mesh.testing.excess_series [--healthy]

prints those samples as a `promtool test rules` case for RatemeshExcessAboveBound: how the
recorded case in deploy/alerts/ratemesh-rules.test.yaml was made.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

from mesh.core.config import CoreConfig
from mesh.core.gcra import NS_PER_S
from mesh.core.reporter import Reporter, excess_estimate
from tests.mesh.core.test_planted_bugs import _open_numbers_from_one, planted
from tests.mesh.testing.test_model_fleet import M, Schedule, T

R, B, b = 50, 10, 2  # the users' limit for pattern 2
MEMBERS = ["a", "b", "c"]
SCRAPE_S = 15  # the sampling interval of the recorded series (a scrape interval)
VIEWS_IDLE_MS = CoreConfig().views_idle_ms  # the default: as a node runs


@dataclass
class Sampled(Schedule):
    """A schedule that reads every member's excess estimate of the key after each step."""

    worst: dict[str, float] = field(default_factory=dict)  # member -> max(estimate - bound)
    scrapes: list[tuple[int, float | None, float | None]] = field(default_factory=list)
    admitted_before: int = 0  # admitted before the traffic came back
    origin_ns: int = 0  # the first scrape's time; then one every SCRAPE_S

    def step(self, step_ns: int = 1_000_000) -> None:
        super().step(step_ns)
        f = self.fleet
        d_ns = f.propagation_delay_ns()
        now = f.now_ns
        scrape = now >= self.origin_ns + len(self.scrapes) * SCRAPE_S * NS_PER_S
        seen: tuple[float | None, float | None] = (None, None)
        for mid, m in f.members.items():
            for key, v in m.reporter.gates.items():
                if key.tenant_id != T or key.metric != M:
                    continue
                est, bound = excess_estimate(v, len(f.ring), d_ns)
                self.worst[mid] = max(self.worst.get(mid, -1e9), est - bound)
                if scrape and mid == "a":  # as the node exports them: units, 3 decimals
                    seen = (round(est / v.scale, 3), round(bound / v.scale, 3))
        if scrape:
            self.scrapes.append((now - self.origin_ns, *seen))


def moving_traffic(
    seed: int,
    *,
    a_ms: int = 1000,
    b_ms: int = 1000,
    idle_ms: int = 900,
    back_ms: int = 2000,
    views_idle_ms: int = 400,
    bug: bool = False,
) -> Sampled:
    """180 offers/s through a for `a_ms`, through b for `b_ms`, an idle of `idle_ms`, and
    through a again for `back_ms`; with `bug`, views made again number from 1."""
    with planted(Reporter, "open_gate", _open_numbers_from_one) if bug else nullcontext():
        s = Sampled(seed, R, B, b, list(MEMBERS), idle_ms=views_idle_ms)
        s.origin_ns = s.fleet.now_ns
        s.serve(["a"], 180, a_ms, [1])
        s.serve(["b"], 180, b_ms, [1])
        s.idle(idle_ms)
        s.worst.clear()
        s.admitted_before = s.admitted
        s.serve(["a"], 180, back_ms, [1])
    return s


def recorded(bug: bool) -> Sampled:
    """The recorded run: a for 30 s, then b for 30 s (a's view is forgotten idle meanwhile,
    at the default views_idle_ms), then a again for 240 s: longer than the alert's 2 min."""
    return moving_traffic(
        1,
        a_ms=30_000,
        b_ms=30_000,
        idle_ms=0,
        back_ms=240_000,
        views_idle_ms=VIEWS_IDLE_MS,
        bug=bug,
    )


def prom_value(v: float) -> str:
    """A sample as Prometheus renders `$value` in an annotation (shortest, no '.0')."""
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text


def promtool_case(s: Sampled, name: str, instance: str, tenant: str = "pattern2") -> list[str]:
    """The samples as one `promtool test rules` case (YAML lines): the estimate and bound
    series, and the alert expected silent at 1 minute and, where the estimate was above
    the bound at every scrape from a point on for over 2 minutes, firing at the end."""
    labels = f'job="ratemesh",instance="{instance}",tenant="{tenant}",metric="{M}"'
    est = " ".join("_" if e is None else prom_value(e) for _, e, _ in s.scrapes)
    bnd = " ".join("_" if x is None else prom_value(x) for _, _, x in s.scrapes)
    end_s = s.scrapes[-1][0] // NS_PER_S
    above = [e is not None and x is not None and e > x for _, e, x in s.scrapes]
    fires = above[-1] and len(above) - above[::-1].index(False) < len(above) - 9
    last = s.scrapes[-1][1]
    lines = [
        f'  - name: "{name}"',
        f"    interval: {SCRAPE_S}s",
        "    input_series:",
        f"      - series: 'ratemesh_excess_estimate{{{labels}}}'",
        f"        values: '{est}'",
        f"      - series: 'ratemesh_excess_bound{{{labels}}}'",
        f"        values: '{bnd}'",
        "    alert_rule_test:",
        "      - alertname: RatemeshExcessAboveBound",
        "        eval_time: 1m",
        "        exp_alerts: []",
        "      - alertname: RatemeshExcessAboveBound",
        f"        eval_time: {end_s}s",
    ]
    if not fires or last is None:
        return [*lines, "        exp_alerts: []"]
    return [
        *lines,
        "        exp_alerts:",
        "          - exp_labels: {severity: page, job: ratemesh, "
        f"instance: {instance}, tenant: {tenant}, metric: {M}}}",
        "            exp_annotations:",
        f'              summary: "{tenant}/{M}: excess estimate above its bound on {instance}"',
        f'              description: "The estimated fleet excess for {tenant}/{M} is '
        f"{prom_value(last)} units, above the envelope N*b + R*d it discloses, for 2 minutes. "
        'Runbook: docs/runbook.md#ratemeshexcessabovebound"',
        '              runbook_url: "docs/runbook.md#ratemeshexcessabovebound"',
    ]


def main(argv: list[str]) -> Iterator[str]:
    bug = "--healthy" not in argv
    s = recorded(bug)
    what = "with views made again numbering from 1" if bug else "as released"
    yield from promtool_case(s, f"recorded pattern 2 on the in-memory fleet, {what}", "a")


if __name__ == "__main__":
    print("\n".join(main(sys.argv[1:])))
