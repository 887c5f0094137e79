"""A worker's excess estimate sees usage its owner acknowledged and did not apply.

Pattern 2 of the envelope work (traffic that moves from a member and comes back after an
idle past views_idle_ms), with its cause (pattern 5: the view made again numbered its
reports from 1, so the owner took them for duplicates, acknowledged them and applied
none) planted again: the fleet admits far above its limit, and the returning member's
`excess_estimate` must pass its `excess_bound` while it does. Without the bug, over the
same schedule (with short sends refunded), the estimate stays within the bound at every
millisecond. The same run, five minutes long and sampled as a scrape would, is what
RatemeshExcessAboveBound is tested on (`excess_series`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mesh.core.reporter import GlobalGate
from tests.mesh._util import require_binary
from tests.mesh.testing.excess_series import B, R, b, moving_traffic, promtool_case, recorded

SEEDS = (1, 2, 3)
RULES = Path(__file__).resolve().parents[3] / "deploy" / "alerts" / "ratemesh-rules.yaml"


@pytest.mark.parametrize("seed", SEEDS)
def test_reports_taken_for_duplicates_show_as_excess_above_the_bound(seed: int) -> None:
    bad = moving_traffic(seed, bug=True)
    over = bad.admitted - bad.admitted_before
    assert over > R * 2 + B + 3 * b + 5, f"seed {seed}: admitted {over}"  # over-admits...
    assert bad.worst["a"] > 0, f"seed {seed}: {bad.worst}"  # ...and a's estimate says so
    good = moving_traffic(seed)
    assert good.check() == [], f"seed {seed}: {good.check()}"
    assert max(good.worst.values()) <= 0, f"seed {seed}: {good.worst}"


def test_without_what_owners_applied_the_estimate_was_blind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same over-admission, the worker not comparing what was applied (an owner that
    does not say it, or the release before): its estimate stays under the bound."""
    monkeypatch.setattr(GlobalGate, "note_applied", lambda self, source, net: None)
    bad = moving_traffic(1, bug=True)
    assert bad.admitted - bad.admitted_before > R * 2 + B + 3 * b + 5
    assert bad.worst["a"] <= 0, bad.worst


@pytest.mark.slow
def test_the_alert_fires_on_the_recorded_over_admission_and_not_without_it(
    tmp_path: Path,
) -> None:
    """Five minutes of pattern 2 on the fleet, a's estimate and bound sampled every 15 s,
    through `promtool test rules` with the shipped rules: RatemeshExcessAboveBound fires
    with the numbering bug planted and stays silent without it (the recorded case in
    deploy/alerts/ratemesh-rules.test.yaml is this output)."""
    promtool = require_binary("promtool", "prometheus")
    bad, good = recorded(bug=True), recorded(bug=False)
    firing = promtool_case(bad, "with the bug", "a")
    silent = promtool_case(good, "without it", "a")
    assert any("exp_alerts:" == line.strip() for line in firing), "\n".join(firing)
    assert not any("exp_alerts:" == line.strip() for line in silent), "\n".join(silent)
    head = [f"rule_files: ['{RULES}']", "evaluation_interval: 30s", "tests:"]
    path = tmp_path / "recorded.test.yaml"
    path.write_text("\n".join([*head, *firing, *silent]) + "\n")
    out = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
