"""`mesh status --fleet`: every ring member's enforced generation per limit, compared; and
`mesh fleet forget-member NAME`: a decommissioned replica's spend-quota cells purged."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from ._output import one_line, positive_s

if TYPE_CHECKING:
    from mesh.config import TlsConfig

__all__ = ["SUBCOMMANDS", "add_parser", "fleet_status", "forget_member"]


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


def add_parser(sub: Any) -> None:
    """`mesh fleet ...`: operations on the whole ring through one member."""
    fleet = sub.add_parser("fleet", help="operations on the whole fleet through one member")
    fsub = fleet.add_subparsers(dest="fleet", required=True, metavar="SUBCOMMAND")
    fm = fsub.add_parser(
        "forget-member",
        help="purge a decommissioned replica's spend-quota cells by name",
        description="Ask the member at --addr (or --config's) for the ring, then every "
        "member to drop NAME's spend-quota cells from the folds it owns and from the "
        "shared-state tier (Redis or PostgreSQL), so a replica back under a new id stops "
        "counting its burn twice. The caller proves itself as `mesh status` does. Exit "
        "status: 0 when every member answered, 1 when one did not (or NAME is still in "
        "the ring, without --force), 2 for a mistake in a flag or file.",
    )
    fm.add_argument("name", metavar="NAME", help="the departed replica's member id")
    fm.add_argument("--addr", help="a member's peer address host:port (default: --config's)")
    fm.add_argument("--config", help="a member's node config: its address, TLS and fleet secret")
    fm.add_argument("--fleet-secret-file", help="prove the caller with this fleet secret")
    fm.add_argument("--timeout", type=float, default=5.0, help="seconds for the whole fleet")
    fm.add_argument(
        "--force",
        action="store_true",
        help="forget NAME even though it is in the ring (its next publish restores it)",
    )


def _caller(
    args: argparse.Namespace,
) -> tuple[str, TlsConfig | None, bytes | None, str | None]:
    """(address, TLS, fleet secret, member id) from --addr, --config, --fleet-secret-file;
    a ConfigError (naming the file) for a mistake in one."""
    from mesh.config import load_config
    from mesh.errors import ConfigError

    addr, tls, secret, target = args.addr, None, None, None
    if args.config:
        try:
            cfg = load_config(args.config)
        except ConfigError as exc:
            raise ConfigError("--config", f"{args.config}: {one_line(str(exc))}") from exc
        addr = addr or cfg.advertise or cfg.listen
        tls, secret, target = cfg.tls, cfg.fleet_secret, cfg.member_id or None
    addr, secret = member_address(args, addr, secret, "a member's node config")
    return addr, tls, secret, target


def member_address(
    args: argparse.Namespace, addr: str | None, secret: bytes | None, config_is: str
) -> tuple[str, bytes | None]:
    """The member's checked --addr and the fleet secret (--fleet-secret-file over the
    config's): the tail every fleet command shares; a ConfigError naming the flag."""
    from mesh.config import read_fleet_secret
    from mesh.errors import ConfigError
    from ratemesh.checks import check_address

    if args.fleet_secret_file:
        try:
            secret = read_fleet_secret(args.fleet_secret_file)
        except ConfigError as exc:
            raise ConfigError("--fleet-secret-file", str(exc)) from exc
    if not addr:
        raise ConfigError("--addr", f"required (or --config, {config_is})")
    return check_address("--addr", addr), secret


def forget_member(args: argparse.Namespace) -> int:
    """Every member's cells dropped for NAME, as JSON on stdout; exit 1 if one did not
    answer (its folds still count NAME until the retention window ages them out)."""
    from mesh.config import check_replica_name
    from mesh.errors import MessageError, PeerError
    from mesh.peer import StillAMember, forget_fleet

    name = check_replica_name("NAME", args.name)
    timeout_s = positive_s("--timeout", args.timeout)
    addr, tls, secret, target = _caller(args)
    try:
        rows = asyncio.run(
            forget_fleet(
                addr,
                name,
                tls=tls,
                fleet_secret=secret,
                target=target,
                timeout_s=timeout_s,
                force=args.force,
            )
        )
    except (PeerError, MessageError, StillAMember) as exc:
        print(f"mesh fleet forget-member: {one_line(str(exc))}", file=sys.stderr)
        return 1
    failed = [r for r in rows if "error" in r]
    report = {
        "forgot": name,
        "asked": addr,
        "members": rows,
        "folds_cells": sum(r.get("folds_cells", 0) for r in rows),
        "tier_cells": sum(r.get("tier_cells", 0) for r in rows),
        "failed": len(failed),
    }
    print(json.dumps(report, sort_keys=True))
    for r in failed:
        print(f"mesh fleet forget-member: {r['member_id']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


SUBCOMMANDS = {"forget-member": forget_member}
