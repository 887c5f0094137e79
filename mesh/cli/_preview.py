"""`mesh policy preview FILE`: before a push, what each changed limit would have done to the
fleet's current traffic, per tenant: admitted now, would admit, would deny
(docs/operations-policy.md, "Previewing a change").

`preview` is the formula, pure and in one place: from the current policies, the new ones and
each tenant's traffic as observed over a window (`Observed`), it computes each changed
limit's answer as an ideal limiter of the limit's fleet-wide capacity over that window
(`capacity_units`) would give it. The command gathers the traffic from a running fleet: it
reads every ring member's `meters` (mesh/node/_meters.py) twice, `--window` seconds apart,
over the Status call (authenticated like `mesh status`), and sums the differences.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mesh.core.policy import DEFAULT_TENANT, Mode, TenantRatePolicy
from mesh.errors import ConfigError
from ratemesh.policy import scope_name
from ratemesh.policyfile import load_policy_file

from ._output import emit, one_line

if TYPE_CHECKING:
    from mesh.config import TlsConfig

__all__ = [
    "Observed",
    "PreviewRow",
    "add_preview_parser",
    "capacity_units",
    "observe",
    "preview",
    "preview_command",
]

WINDOW_S_MAX = 300.0  # the longest sampling window the command waits through
ROWS_MAX = 10_000  # rows a preview prints (the meters a member lists are bounded alike)


@dataclass(frozen=True, slots=True)
class Observed:
    """One tenant's traffic on one metric, summed over the fleet, over `window_s`: units
    admitted, and calls admitted and denied (a denial is counted in calls; `offered_units`
    reads each denied call as the mean admitted call)."""

    admitted_units: int
    admitted_calls: int
    denied_calls: int

    @property
    def offered_units(self) -> int:
        d = self.denied_calls
        if not self.admitted_calls:  # no admitted call to measure: one unit a call
            return self.admitted_units + d
        return self.admitted_units + -(-d * self.admitted_units // self.admitted_calls)


@dataclass(frozen=True, slots=True)
class PreviewRow:
    tenant: str
    metric: str
    was: TenantRatePolicy | None  # the limit deciding the tenant now (None: none)
    new: TenantRatePolicy | None  # after the push (None: none, nothing is admitted)
    admitted_now: int  # units admitted over the window
    offered: int  # admitted + denied (estimated: `Observed.offered_units`)
    would_admit: int
    would_deny: int

    def to_json(self, window_s: float) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "metric": self.metric,
            "from_generation": None if self.was is None else self.was.generation,
            "to_generation": None if self.new is None else self.new.generation,
            "window_s": window_s,
            "admitted_now": self.admitted_now,
            "offered": self.offered,
            "would_admit": self.would_admit,
            "would_deny": self.would_deny,
        }


def capacity_units(p: TenantRatePolicy | None, window_s: float, members: int) -> int | None:
    """The most the fleet admits under `p` over `window_s` from full: R x window + B for a
    fleet-wide limit (global, share, strict, redis), N times that for `local` (each of the N
    members enforces the whole limit); None for no cap (disabled, or shadow: it admits
    everything); 0 with no policy (policy_unknown: nothing is admitted). A spend quota is
    not previewed (its cap runs over a calendar period): None."""
    if p is None:
        return 0
    if not p.enabled or p.shadow or p.quota is not None:
        return None
    one = math.floor(p.target_rate * window_s / p.scale) + p.burst_units
    return one * (max(1, members) if p.mode is Mode.LOCAL else 1)


def _resolve(
    by_key: dict[tuple[str, str], TenantRatePolicy], tenant: str, metric: str
) -> TenantRatePolicy | None:
    """The policy deciding `tenant` on `metric`: its own, else the metric's default."""
    return by_key.get((tenant, metric)) or by_key.get((DEFAULT_TENANT, metric))


def preview(
    current: list[TenantRatePolicy],
    new: list[TenantRatePolicy],
    observed: dict[tuple[str, str], Observed],
    window_s: float,
    members: int,
) -> list[PreviewRow]:
    """Per (tenant, metric) whose deciding limit changes (values, not only generation): what
    the tenant's `observed` traffic got, and what the new limit would give it. A tenant
    under a changed limit with no traffic gets a row of zeros; one whose limit does not
    change gets none. `new` is the set after the push: a key it leaves out keeps its
    current policy (as `mesh policy apply` without --prune)."""
    if window_s <= 0:
        raise ConfigError("window_s", f"must be > 0, got {window_s}")
    was = {(p.tenant_id, p.metric): p for p in current}
    after = dict(was)
    after.update({(p.tenant_id, p.metric): p for p in new})
    tenants = set(observed)
    tenants.update(k for k in after if k[0] != DEFAULT_TENANT)
    rows: list[PreviewRow] = []
    for tenant, metric in sorted(tenants):
        p0, p1 = _resolve(was, tenant, metric), _resolve(after, tenant, metric)
        if p0 is p1 or (p0 is not None and p1 is not None and p0.values() == p1.values()):
            continue
        seen = observed.get((tenant, metric), Observed(0, 0, 0))
        offered = seen.offered_units
        cap = capacity_units(p1, window_s, members)
        admit = offered if cap is None else min(offered, cap)
        rows.append(
            PreviewRow(tenant, metric, p0, p1, seen.admitted_units, offered, admit, offered - admit)
        )
    return rows


def observe(
    before: list[list[dict[str, Any]]], after: list[list[dict[str, Any]]]
) -> dict[tuple[str, str], Observed]:
    """The fleet's traffic between two readings of every member's `meters` rows (the same
    members, in any order): per (tenant, metric), the differences summed over members, a
    count that fell read as a restart from 0 (the limit went idle in between)."""
    out: dict[tuple[str, str], list[int]] = {}
    for then_rows, now_rows in zip(before, after, strict=True):
        then = {(r["tenant"], r["metric"]): _counts(r) for r in then_rows}
        for r in now_rows:
            k = (r["tenant"], r["metric"])
            now, was = _counts(r), then.get(k, (0, 0, 0))
            acc = out.setdefault(k, [0, 0, 0])
            for j in range(3):
                acc[j] += now[j] - was[j] if now[j] >= was[j] else now[j]
    return {k: Observed(*v) for k, v in out.items()}


def _counts(row: dict[str, Any]) -> tuple[int, int, int]:
    return (
        int(row.get("admitted_units", 0)),
        int(row.get("admitted_calls", 0)),
        int(row.get("denied_calls", 0)),
    )


# ---- the command ---------------------------------------------------------------------------


def add_preview_parser(psub: Any) -> None:
    """`mesh policy preview` under the `policy` command's subparsers."""
    pv = psub.add_parser(
        "preview",
        help="what a policies file would do to the fleet's current traffic, per tenant",
        description="Read every ring member's meters twice, --window seconds apart, and "
        "print per tenant of each changed limit: units admitted now, would admit and would "
        "deny under the file's policies. Exit 0, 1 when a member did not answer, 2 for a "
        "mistake in a flag or file.",
    )
    pv.add_argument("file", help="the policies YAML file to preview")
    now = pv.add_mutually_exclusive_group(required=True)
    now.add_argument("--current", help="the policies file the fleet runs now (policies.file)")
    now.add_argument(
        "--coordinator",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="read the current policies from governord (as mesh policy list does)",
    )
    pv.add_argument("--api-key-file", help="with --coordinator: a file holding the API key")
    pv.add_argument("--api-key-env", help="with --coordinator: a variable holding the API key")
    pv.add_argument("--ca", help="with --coordinator: verify governord against this CA file")
    pv.add_argument("--addr", help="a member's peer address host:port (default: the --config's)")
    pv.add_argument("--config", help="a member's node config: its address, TLS, fleet secret")
    pv.add_argument("--fleet-secret-file", help="prove the caller with this fleet secret")
    pv.add_argument("--window", type=float, default=5.0, help="seconds of traffic to read")
    pv.add_argument("--timeout", type=float, default=5.0, help="seconds per reading")
    pv.add_argument("--json", action="store_true", help="JSON only (no table on stderr)")
    pv.add_argument("--table", action="store_true", help="a table instead of JSON")


def preview_command(
    args: argparse.Namespace, connect_flags: Callable[[argparse.Namespace], Callable[[], Any]]
) -> int:
    """`connect_flags`: the `mesh policy` commands' check of the --coordinator flags, which
    returns the client's maker (their one place)."""
    from mesh.config import load_config, read_fleet_secret
    from ratemesh.checks import check_address

    if not 0 < args.window <= WINDOW_S_MAX:
        raise ConfigError("--window", f"must be > 0 and <= {WINDOW_S_MAX:g}, got {args.window}")
    if args.timeout <= 0:
        raise ConfigError("--timeout", f"must be > 0, got {args.timeout}")
    new = [d.policy for d in load_policy_file(args.file, where=args.file, error=ConfigError)]
    connect = None
    current: list[TenantRatePolicy] = []
    if args.coordinator is not None:
        connect = connect_flags(args)  # a flag mistake is exit 2 before any call
    else:
        current = [
            d.policy for d in load_policy_file(args.current, where=args.current, error=ConfigError)
        ]
    addr, tls, secret, target = args.addr, None, None, None
    if args.config:
        cfg = load_config(args.config)  # a mistake names the file's field
        addr = addr or cfg.advertise or cfg.listen
        tls, secret, target = cfg.tls, cfg.fleet_secret, cfg.member_id or None
    if args.fleet_secret_file:
        secret = read_fleet_secret(args.fleet_secret_file)
    if not addr:
        raise ConfigError("--addr", "required (or --config, a member's node config)")
    addr = check_address("--addr", addr)
    from mesh.errors import MessageError, PeerError

    try:
        if connect is not None:
            current = asyncio.run(_governords(connect))
        before, after, omitted = asyncio.run(
            _sample(addr, tls, secret, target, args.window, args.timeout)
        )
    except (PeerError, MessageError) as exc:  # an absence or an answer, not a mistake
        print(f"mesh policy preview: {one_line(str(exc))}", file=sys.stderr)
        return 1
    rows = preview(current, new, observe(before, after), args.window, len(after))
    report = {
        "window_s": args.window,
        "members": len(after),
        "rows": [r.to_json(args.window) for r in rows[:ROWS_MAX]],
        "rows_omitted": max(0, len(rows) - ROWS_MAX),
        # a member's quietest tenants past its meters' bound: previewed as if idle
        "meters_omitted": omitted,
    }
    emit(report, args, _table(rows[:ROWS_MAX], args.window))
    return 0


async def _governords(connect: Callable[[], Any]) -> list[TenantRatePolicy]:
    """governord's current policies (its List call)."""
    client = connect()
    try:
        return list((await client.list()).policies)
    finally:
        await client.close()


async def _sample(
    addr: str,
    tls: TlsConfig | None,
    secret: bytes | None,
    target: str | None,
    window_s: float,
    timeout_s: float,
) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]], int]:
    """Every member's meters, read twice `window_s` apart (each reading of all members in
    parallel, within `timeout_s`), and the most rows a member left out of its answer (its
    quietest tenants, past METERS_SHOWN_MAX). A member that does not answer fails it."""
    from mesh.errors import MessageError
    from mesh.peer import fetch_status

    seed = await fetch_status(
        addr, tls=tls, timeout_s=timeout_s, fleet_secret=secret, target=target
    )
    members = seed.get("membership", {}).get("addresses")
    if not isinstance(members, dict) or not members:
        raise MessageError("membership.addresses", f"{addr} listed no members")

    omitted = 0

    async def read() -> list[list[dict[str, Any]]]:
        nonlocal omitted
        answers = await asyncio.gather(
            *(
                fetch_status(a, tls=tls, timeout_s=timeout_s, fleet_secret=secret, target=m)
                for m, a in sorted(members.items())
            )
        )
        out = []
        for m, status in zip(sorted(members), answers, strict=True):
            rows = status.get("meters") if isinstance(status, dict) else None
            if not isinstance(rows, list) or not all(_is_row(r) for r in rows):
                raise MessageError("meters", f"member {m} has none (an older release?)")
            out.append(rows)
            left = status.get("meters_omitted", 0)
            omitted = max(omitted, left if type(left) is int else 0)
        return out

    before = await read()
    await asyncio.sleep(window_s)
    return before, await read(), omitted


def _is_row(r: Any) -> bool:
    return (
        isinstance(r, dict)
        and isinstance(r.get("tenant"), str)
        and isinstance(r.get("metric"), str)
        and all(
            type(r.get(k)) is int and r[k] >= 0
            for k in ("admitted_units", "admitted_calls", "denied_calls")
        )
    )


def _table(rows: list[PreviewRow], window_s: float) -> str:
    head = f"{'limit':<32} {'generation':>12} {'admitted now':>13} {'would admit':>12} "
    head += f"{'would deny':>11}   (units over {window_s:g} s)"
    lines = [head]
    for r in rows:
        gens = f"{'-' if r.was is None else r.was.generation}->"
        gens += "-" if r.new is None else str(r.new.generation)
        lines.append(
            f"{scope_name(r.tenant, r.metric):<32} {gens:>12} {r.admitted_now:>13} "
            f"{r.would_admit:>12} {r.would_deny:>11}"
        )
    if not rows:
        lines.append("(no limit the file changes decides any tenant)")
    return "\n".join(lines)
