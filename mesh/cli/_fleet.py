"""`mesh status --fleet`: every ring member's enforced generation per limit, compared."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from ._output import one_line

if TYPE_CHECKING:
    from mesh.config import TlsConfig

__all__ = ["fleet_status"]


def fleet_status(
    args: argparse.Namespace,
    addr: str,
    *,
    tls: TlsConfig | None,
    secret: bytes | None,
    target: str | None,
    timeout_s: float,
) -> int:
    """Ask `addr`'s member for the ring, then every member within `timeout_s` in all.
    JSON on stdout and the table on stderr (or the table alone with --table); exit 0 when
    every member answered and all enforce the same generation of every limit, 1 when not
    (or when `addr` itself did not answer)."""
    from mesh.errors import MessageError, PeerError
    from mesh.peer import fetch_fleet
    from mesh.telemetry import fleet_report, fleet_table

    try:
        answers = asyncio.run(
            fetch_fleet(addr, tls=tls, fleet_secret=secret, target=target, timeout_s=timeout_s)
        )
    except (PeerError, MessageError) as exc:  # the member's absence or answer, not a mistake
        print(f"mesh status --fleet: {one_line(str(exc))}", file=sys.stderr)
        return 1
    report = {"asked": addr, **fleet_report(answers)}
    table = fleet_table(report)
    if args.table:
        print(table)
    else:
        print(json.dumps(report, sort_keys=True))
        if not args.json:
            print(table, file=sys.stderr)
    return 1 if report["diverged"] else 0
