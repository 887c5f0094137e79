"""`gov`: run any command under a slot (seed 003).

    gov run [--name N] [--max N] [--priority high|normal|low] [--wait-s S] -- CMD ARGS...
    gov wrap 'CMD'              # prints a shell line that runs CMD under gov
    gov status [--json]         # slots, holders, waiters, cooldown; governord's leases
    gov cooldown SECONDS [--name N]

A mistake in gov's own flags is one line and exit 2; anything after `--` is the command's.
`gov run` ends with the command's status (or its signal). With GOVERNOR_ADDR set, a governord
that refuses the key or is not a host:port is one line and exit 2, one that does not answer
one line and exit 69; only without GOVERNOR_ADDR does gov use this machine's slots alone.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from governor.client._leaseslot import (
    FLEET,
    GovernordUnreachable,
    LeaseSlot,
    fleet_cooldown,
    governord_addr,
)
from governor.client._slot import publish, take_slot
from governor.gov._cooldown import COOLDOWN_DEFAULT_S, PATTERNS_DEFAULT, Cooldown, matcher
from governor.gov._paths import DEFAULT_NAME, GovDir, check_name, gov_dir, read_json, write_new
from governor.gov._run import exit_like, run_command
from governor.gov._semaphore import Holder, LocalSemaphore, alive
from governor.gov._slots import PRIORITIES, TTL_DEFAULT_S, Acquired, Attempt
from ratemesh.errors import ConfigError
from ratemesh.operator import EXIT_USAGE, OneLineParser, one_line

__all__ = ["main", "status", "fleet_status"]

MAX_DEFAULT = 2  # GOV_MAX overrides: start conservative (seed 003)
EXIT_UNAVAILABLE = 69  # GOVERNOR_ADDR set, governord not answering (sysexits EX_UNAVAILABLE)


def _parser() -> OneLineParser:
    p = OneLineParser(prog="gov", description="a slot for any command (ratemesh)")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="take a slot, run CMD, give the slot back")
    _slot_flags(run)
    run.add_argument("argv", nargs="+", metavar="CMD", help="the command, after --")
    wrap = sub.add_parser("wrap", help="print a shell line that runs CMD under gov")
    _slot_flags(wrap)
    wrap.add_argument("line", metavar="'CMD'", help="a whole shell command line")
    st = sub.add_parser("status", help="slots, holders, waiters and cooldown")
    st.add_argument("--json", action="store_true")
    cd = sub.add_parser("cooldown", help="back this machine (or one name) off by hand")
    cd.add_argument("seconds", type=float, help="seconds from now (0 clears it)")
    cd.add_argument("--name", default=None, help="only this slot name")
    return p


def _slot_flags(p: Any) -> None:
    p.add_argument("--name", default=os.environ.get("GOV_NAME", DEFAULT_NAME))
    p.add_argument("--max", type=int, default=int(os.environ.get("GOV_MAX", MAX_DEFAULT)))
    p.add_argument("--priority", choices=sorted(PRIORITIES), default="normal")
    p.add_argument("--wait-s", type=float, default=None, help="override the priority's window")
    p.add_argument("--ttl-s", type=float, default=TTL_DEFAULT_S)
    p.add_argument("--cooldown-s", type=float, default=COOLDOWN_DEFAULT_S)
    p.add_argument(
        "--name-cooldown",
        action="store_true",
        help="a 429 cools down only this name, not the whole machine",
    )
    p.add_argument(
        "--pattern",
        action="append",
        default=None,
        help="a regex that counts as a 429 in the output (repeatable; GOV_PATTERNS)",
    )


def _patterns(given: list[str] | None) -> tuple[str, ...]:
    if given:
        return tuple(given)
    env = os.environ.get("GOV_PATTERNS")
    if env:
        return tuple(line for line in env.splitlines() if line.strip())
    return PATTERNS_DEFAULT


def status(root: GovDir, now: float | None = None) -> dict[str, Any]:
    """`gov status --json`: the keys DESIGN.md section 5 names."""
    t = time.time() if now is None else now
    slots: dict[str, Any] = {}
    waiters = []
    cooldowns = {}
    for name in root.names():
        sem = LocalSemaphore(root, name)
        meta = read_json(sem.dir / "max.json") or {}
        slots[name] = {
            "max": meta.get("max"),
            "holders": [
                {
                    "slot": i,
                    "pid": h.pid,
                    "command": h.command,
                    "age_s": round(t - h.started, 3),
                    "priority": h.priority,
                }
                for i, h, _beat in sem.holders()
            ]
            + _lease_holders(root, name, t),  # this machine's holders of governord leases
        }
        for path in sorted(root.waiters(name).iterdir()):
            rec = read_json(path) or {}
            if not alive(rec.get("pid"), rec.get("pid_start")):
                path.unlink(missing_ok=True)  # a waiter that died while waiting
                continue
            waiters.append(
                {
                    "name": name,
                    "pid": rec.get("pid"),
                    "command": rec.get("command", ""),
                    "age_s": round(t - float(rec.get("started", t)), 3),
                    "priority": rec.get("priority"),
                }
            )
        left = Cooldown(root).remaining_s(name, t) if name else 0.0
        if left > 0:
            cooldowns[name] = round(left, 3)
    return {
        "dir": str(root.root),
        "slots": slots,
        "waiters": waiters,
        "cooldown_remaining_s": round(Cooldown(root).remaining_s(None, t), 3),
        "cooldowns": cooldowns,  # per name, where a name's own (or the machine's) applies
        "governord": os.environ.get("GOVERNOR_ADDR") or None,
    }


def fleet_status(root: GovDir, now: float | None = None) -> dict[str, Any]:
    """`status`, and with GOVERNOR_ADDR each name's leases as governord holds them
    (`fleet`: max, held and waiting across every machine)."""
    s = status(root, now)
    if s["governord"]:
        s["fleet"] = _fleet(root, list(s["slots"]))
    return s


def _status_table(s: dict[str, Any]) -> str:
    lines = [f"gov state in {s['dir']}"]
    if s["cooldown_remaining_s"]:
        lines.append(f"cooldown: {s['cooldown_remaining_s']:.1f}s left (whole machine)")
    for name, info in s["slots"].items():
        lines.append(f"{name}: {len(info['holders'])}/{info['max']} held")
        for h in info["holders"]:
            label = "lease" if h["slot"] == "lease" else f"slot {h['slot']}"
            lines.append(f"  {label}: pid {h['pid']} {h['age_s']:.1f}s {h['command']}")
    for name, f in s.get("fleet", {}).items():
        lines.append(
            f"{name} across the fleet (governord {s['governord']}): {f['held']}/{f['max']} "
            f"leases held, {f['waiting']} waiting"
        )
    for w in s["waiters"]:
        lines.append(f"waiting for {w['name']}: pid {w['pid']} {w['age_s']:.1f}s {w['command']}")
    return "\n".join(lines)


def _run(args: Any, root: GovDir) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("CMD", "gov run needs a command after --")
    check_name(args.name)
    pattern = matcher(_patterns(args.pattern))
    attempt = Attempt(
        args.name,
        args.max,
        priority=args.priority,
        wait_s=args.wait_s,
        command=shlex.join(argv),
        ttl_s=args.ttl_s,
        root=root,
    )
    remote = _governord(args.name, args.max)
    got = take_slot(attempt, remote)
    held = _lease_record(root, got, attempt) if got.lease else None
    try:
        status_ = run_command(
            argv,
            got,
            root,
            pattern=pattern,
            cooldown_s=args.cooldown_s,
            cooldown_name=args.name if args.name_cooldown else None,
            on_trip=lambda s: publish(remote, s, args.name_cooldown),
        )
    finally:
        if held is not None:
            held.unlink(missing_ok=True)
        if remote is not None:
            remote.give_back()
    return exit_like(status_)


def _governord(name: str, max_slots: int) -> LeaseSlot | None:
    """The configured governord, its session open; None without GOVERNOR_ADDR (this
    machine's slots). One that is misconfigured or silent raises (ConfigError naming the
    variable, GovernordUnreachable): gov does not swap a fleet-wide limit for a local one
    behind the operator's back."""
    if not governord_addr():
        return None
    remote = LeaseSlot(name, max_slots)
    remote.check()
    return remote


def _lease_record(root: GovDir, got: Acquired, attempt: Attempt) -> Path:
    """Say on this machine who holds a governord lease of `got.name` (pid, command, since):
    governord counts leases, `gov status` names their holders here."""
    path = root.leases(got.name) / f"{attempt.holder.token}.json"
    write_new(path, json.dumps(asdict(attempt.holder), sort_keys=True))
    return path


def _lease_holders(root: GovDir, name: str, t: float) -> list[dict[str, Any]]:
    out = []
    for path in sorted(root.leases(name).iterdir()):
        h = Holder.from_dict(read_json(path) or {})
        if h is None or not alive(h.pid, h.pid_start):
            path.unlink(missing_ok=True)  # a holder killed with its lease: governord frees it
            continue
        out.append(
            {
                "slot": "lease",
                "pid": h.pid,
                "command": h.command,
                "age_s": round(t - h.started, 3),
                "priority": h.priority,
            }
        )
    return out


def _fleet(root: GovDir, names: list[str]) -> dict[str, Any]:
    """Each gov name as governord holds it (GOVERNOR_ADDR): its max across the fleet and
    the leases held and waiting; ConfigError or GovernordUnreachable as for `gov run`."""
    remote = LeaseSlot(FLEET, 1)
    remote.check()
    try:
        info = remote.node_info()
    finally:
        remote.give_back()
    limits, held, waiting = info.get("limits", {}), info.get("held", {}), info.get("waiting", {})
    return {
        name: {
            "max": limits.get(name),
            "held": held.get(name, 0),
            "waiting": waiting.get(name, 0),
        }
        for name in sorted(set(limits) | set(held) | set(waiting))
        if name != FLEET and (name in names or limits.get(name) is not None)
    }


def _wrap(args: Any) -> str:
    flags = ["--name", args.name, "--max", str(args.max), "--priority", args.priority]
    if args.wait_s is not None:
        flags += ["--wait-s", f"{args.wait_s:g}"]
    return shlex.join(["gov", "run", *flags, "--", "sh", "-c", args.line])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    root = gov_dir()
    try:
        if args.command == "run":
            return _run(args, root)
        if args.command == "wrap":
            print(_wrap(args))
            return 0
        if args.command == "status":
            s = fleet_status(root)
            print(json.dumps(s, sort_keys=True) if args.json else _status_table(s))
            return 0
        if args.command == "cooldown":
            name = None if args.name is None else check_name(args.name)
            until = Cooldown(root).set(args.seconds, name)
            left = max(0.0, until - time.time())
            where = "this machine" if name is None else name
            if governord_addr() and fleet_cooldown():
                remote = LeaseSlot(name or FLEET, 1)
                remote.check()
                failed = remote.publish_cooldown(args.seconds, name is not None, replace=True)
                remote.give_back()
                where += " on every machine" if failed is None else f" ({failed})"
            print(f"gov: cooldown {left:.0f}s for {where}")
            return 0
    except (ConfigError, ValueError) as exc:
        print(f"gov: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except GovernordUnreachable as exc:
        print(
            f"gov: {one_line(exc)}; unset GOVERNOR_ADDR to use this machine's slots only",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    except OSError as exc:
        print(f"gov: {exc.filename or root.root}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
