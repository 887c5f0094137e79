"""Paths of the operations kit and the PromQL expressions in it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/ratemesh.json"
RULES = ROOT / "deploy/alerts/ratemesh-rules.yaml"
RULE_TESTS = ROOT / "deploy/alerts/ratemesh-rules.test.yaml"
RUNBOOK = ROOT / "docs/runbook.md"

_LABEL_VALUES = re.compile(r"label_values\(\s*([^,()]+)")


def dashboard() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return out


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def expressions() -> dict[str, str]:
    """Every PromQL expression of the dashboard and the rules, by where it is."""
    out: dict[str, str] = {}
    d = dashboard()
    for p in d["panels"]:
        for t in p.get("targets", []):
            out[f"dashboard panel {p['title']!r} {t['refId']}"] = t["expr"]
    for v in d["templating"]["list"]:
        m = _LABEL_VALUES.match(v.get("query", "")) if v["type"] == "query" else None
        if m:
            out[f"dashboard variable {v['name']}"] = m.group(1)
    for r in rules():
        out[f"rule {r['alert']}"] = r["expr"]
    return out


def rule_test_series() -> set[str]:
    """The metric names the rules' unit tests feed promtool."""
    doc = yaml.safe_load(RULE_TESTS.read_text())
    return {
        s["series"].split("{", 1)[0].strip()
        for t in doc["tests"]
        for s in t.get("input_series", [])
    }


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).lower())
            anchors.add(text.replace(" ", "-"))
    return anchors
