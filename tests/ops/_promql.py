"""The metric names a PromQL expression reads, for checking a dashboard and alert rules
against what the daemons export (tests/ops/test_exported_names.py).

Not a PromQL parser: strings, label matchers `{...}`, ranges `[...]` and the label lists
of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` are blanked, and what is left
that looks like a name and is neither a function call, a keyword nor a number is a metric.
"""

from __future__ import annotations

import re

__all__ = ["metric_names", "exported_names", "SYNTHETIC"]

SYNTHETIC = frozenset({"up"})  # series Prometheus makes itself for each scrape target

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"and", "or", "unless", "atan2", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_LABELS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?")


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub('""', expr)
    text = _LABELS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _NAME.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        names.add(name)
    return names


_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.M)
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def exported_names(text: str) -> set[str]:
    """Every name a query may use on a Prometheus text scrape: each family's name, its
    samples' names, and the names its type implies even before it has a sample (a
    histogram's _bucket, _sum and _count; a counter's _total)."""
    names = set(_SAMPLE.findall(text))
    for name, kind in _TYPE.findall(text):
        names.add(name)
        base = name.removesuffix("_total") if kind == "counter" else name
        names.update(base + s for s in _SUFFIXES.get(kind, ()))
    return names
