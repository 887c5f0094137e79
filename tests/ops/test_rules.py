"""The alert rules and the dashboard, offline: promtool checks the rules and runs their
unit tests (every alert firing and silent), every alert links a runbook section that
exists, and the dashboard's first row is the excess envelope (estimate beside bound)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.mesh._util import require_binary
from tests.ops._kit import RULE_TESTS, RULES, RUNBOOK, dashboard, github_anchors, rules
from tests.ops._promql import exported_names, metric_names

RUNBOOK_PAGE = "{{ with $externalLabels.ratemesh_docs }}{{ . }}{{ else }}docs{{ end }}/runbook.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool", "prometheus")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules() -> None:
    out = _promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_promtool_runs_the_rules_unit_tests() -> None:
    out = _promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fired: set[str] = set()
    silent: set[str] = set()
    for t in doc["tests"]:
        for a in t["alert_rule_test"]:
            (fired if a.get("exp_alerts") else silent).add(a["alertname"])
    alerts = {r["alert"] for r in rules()}
    assert alerts - fired == set() and alerts - silent == set()


def test_every_alert_has_a_summary_and_a_description_linking_a_runbook_section() -> None:
    anchors = github_anchors(RUNBOOK.read_text())
    for r in rules():
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], r["alert"]
        page, _, anchor = ann["runbook_url"].partition("#")
        # absolute under the external label ratemesh_docs, the repository path without it
        assert page == RUNBOOK_PAGE and anchor in anchors, (r["alert"], anchor)
        assert f"docs/runbook.md#{anchor}" in ann["description"], r["alert"]


def test_the_first_row_is_the_excess_envelope_estimate_beside_bound() -> None:
    panels = dashboard()["panels"]
    assert panels[0]["type"] == "row" and "Excess envelope" in panels[0]["title"]
    first_row: list[set[str]] = []
    for p in panels[1:]:
        if p["type"] == "row":
            break
        first_row.extend(metric_names(t["expr"]) for t in p["targets"])
    names = set().union(*first_row)
    assert {"ratemesh_excess_estimate", "ratemesh_excess_bound"} <= names
    rows = [p["title"] for p in panels if p["type"] == "row"]
    for topic in ("Admissions", "Suspensions", "d:", "Peer", "Policy generations", "commit"):
        assert any(topic in r for r in rows), topic
    assert any("Credit" in r for r in rows)


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "job", "governord_job"} <= variables
    for p in d["panels"]:
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"][
            "w"
        ] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"])


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (reason) (rate(ratemesh_denied_total{job=~"$job"}[$__rate_interval]))',
         {"ratemesh_denied_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(governor_commit_seconds_bucket[5m])))",
         {"governor_commit_seconds_bucket"}),
        ('count by (tenant) (count_values by (tenant) ("g", ratemesh_policy_generation))',
         {"ratemesh_policy_generation"}),
        ("a_total > on (instance) group_left (tenant) b or up == 0 unless c offset 5m",
         {"a_total", "b", "up", "c"}),
    ],
)  # fmt: skip
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_histogram_or_counter_without_samples_still_names_its_series() -> None:
    text = "# HELP h x\n# TYPE h histogram\n# HELP c x\n# TYPE c counter\ng 1.0\n"
    assert {"h_bucket", "h_sum", "h_count", "c_total", "g"} <= exported_names(text)
