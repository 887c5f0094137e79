"""How every `mesh` command answers the operator: one JSON object on stdout and a table on
stderr (or the table alone with --table); a refused flag or value as one line on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ratemesh.checks import check_float
from ratemesh.errors import ConfigError
from ratemesh.operator import OneLineParser, one_line

__all__ = ["OneLineParser", "emit", "one_line", "positive_s", "table_rows"]


def table_rows(obj: dict[str, Any], prefix: str = "") -> list[str]:
    """A nested result as `dotted.key   value` rows."""
    rows = []
    for k, v in obj.items():
        if isinstance(v, dict):
            rows += table_rows(v, f"{prefix}{k}.")
        else:
            rows.append(f"{prefix + k:<40} {v}")
    return rows


def emit(result: dict[str, Any], args: argparse.Namespace, table: str | None = None) -> None:
    """One JSON object on stdout; a human table on stderr (or stdout with --table): `table`,
    or the result's rows when the command has no table of its own."""
    if table is None:
        table = "\n".join(table_rows(result))
    if getattr(args, "table", False):
        print(table)
        return
    print(json.dumps(result, sort_keys=True))
    if not getattr(args, "json", False):
        print(table, file=sys.stderr)


def positive_s(flag: str, value: float) -> float:
    """A duration flag: finite and > 0 (argparse's float() takes "nan" and "inf")."""
    if check_float(flag, value) <= 0:
        raise ConfigError(flag, f"must be > 0, got {value}")
    return value
