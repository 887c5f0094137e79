"""`mesh policy apply|list|history|rollback`: the coordinator's side of governord's policy API.

`apply -f FILE` reads a policies file (the format nodes load; `generation` may be left out),
compares it with governord's current policies and prints the diff: added, changed and removed
keys with the generations they get, and what stays. Then (not with `--dry-run`) it pushes each
change as a put that names the generation the diff was computed against, so a change another
writer made in between is refused, not overwritten. Keys governord holds that the file does
not name are listed as removed, and removed only with `--prune`. A rollback is a new
generation with an old generation's values (`rollback TENANT METRIC --to GEN`).

Errors: a mistake in a flag or the file is one line, exit 2; governord refusing or not
answering is one line naming the call, exit 1. docs/policies.md describes the rules.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mesh.errors import ConfigError, MeshError, PeerError
from ratemesh.apikey import read_api_key
from ratemesh.checks import check_addresses
from ratemesh.errors import RatemeshError
from ratemesh.policy import check_metric, descriptor_tenant, scope_name
from ratemesh.policyfile import load_policy_file

from ._output import one_line
from ._policydiff import Change, Diff, compute_diff, policy_values
from ._preview import add_preview_parser, preview_command

__all__ = ["add_parser", "apply", "history", "list_", "rollback", "SUBCOMMANDS"]

API_KEY_ENV = "RATEMESH_API_KEY"  # the key's variable when no --api-key-file/--api-key-env


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--coordinator",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="governord (several: leader and standbys; calls follow the leader)",
    )
    p.add_argument("--api-key-file", help="a file holding the API key (its first line)")
    p.add_argument("--api-key-env", help=f"a variable holding the API key (default ${API_KEY_ENV})")
    p.add_argument("--ca", help="verify governord's TLS certificate against this CA file")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="per call, seconds, resends included (an election is waited out within it)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def add_parser(sub: Any) -> None:
    """The `policy` command and its subcommands, under the `mesh` parser's `sub`."""
    pol = sub.add_parser("policy", help="push and read mesh policies at governord")
    psub = pol.add_subparsers(dest="policy", required=True, metavar="SUBCOMMAND")
    ap = psub.add_parser("apply", help="diff a policies file against governord, then push it")
    ap.add_argument("-f", "--file", required=True, help="the policies YAML file")
    ap.add_argument("--dry-run", action="store_true", help="print the diff, push nothing")
    ap.add_argument("--prune", action="store_true", help="also remove keys the file omits")
    _connection_flags(ap)
    ls = psub.add_parser("list", help="governord's current policies")
    _connection_flags(ls)
    hi = psub.add_parser("history", help="a tenant's generations, oldest first")
    hi.add_argument("tenant_id")
    hi.add_argument("--metric", help="one metric only")
    _connection_flags(hi)
    rb = psub.add_parser("rollback", help="a new generation with an old generation's values")
    rb.add_argument("tenant_id")
    rb.add_argument("metric")
    rb.add_argument("--to", dest="to", type=int, required=True, metavar="GEN")
    rb.add_argument("--descriptor", metavar="KEY=VALUE", help="the key's descriptor, if any")
    rb.add_argument("--dry-run", action="store_true", help="print the change, push nothing")
    _connection_flags(rb)
    add_preview_parser(psub)


# ---- the commands --------------------------------------------------------------------------


def _connect(args: argparse.Namespace) -> Callable[[], Any]:
    """Check the connection flags now (a mistake is exit 2 before any call); the client is
    made inside the event loop, which grpc's channels belong to."""
    from mesh.peer import CoordinatorClient  # grpc only when a command talks to governord

    addr = ",".join(check_addresses("--coordinator", args.coordinator, error=ConfigError))
    if args.api_key_file is None and args.api_key_env is None:
        env = API_KEY_ENV if API_KEY_ENV in os.environ else None
        if env is None:
            raise ConfigError(
                "--api-key-file", f"give --api-key-file, --api-key-env or set ${API_KEY_ENV}"
            )
    else:
        env = args.api_key_env
    key = read_api_key(file=args.api_key_file, env=env, where="--api-key", error=ConfigError)
    if args.timeout <= 0:
        raise ConfigError("--timeout", f"must be > 0, got {args.timeout}")
    if args.ca is not None and not os.path.isfile(args.ca):
        raise ConfigError("--ca", f"file {args.ca} does not exist")
    return lambda: CoordinatorClient(addr, api_key=key, timeout_s=args.timeout, server_ca=args.ca)


def _run(args: argparse.Namespace, what: str, body: Callable[[Any], Awaitable[int]]) -> int:
    connect = _connect(args)

    async def main() -> int:
        client = connect()
        try:
            return await body(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except PeerError as exc:  # governord refused or did not answer: not a flag mistake
        print(f"mesh policy {what}: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except MeshError as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"mesh policy {what}: governord's answer: {one_line(str(exc))}", file=sys.stderr)
        return 1


def _last_generations(snap: Any) -> dict[tuple[str, str], int]:
    last = {(p.tenant_id, p.metric): p.generation for p in snap.policies}
    for t in snap.removed:
        last[(t.tenant_id, t.metric)] = max(last.get((t.tenant_id, t.metric), 0), t.generation)
    return last


def apply(args: argparse.Namespace) -> int:
    entries = load_policy_file(
        args.file, where=args.file, error=ConfigError, generation_required=False, one_per_key=True
    )
    desired = [(d.policy, d.explicit) for d in entries]

    async def body(client: Any) -> int:
        snap = await client.list()
        diff = compute_diff(
            desired, list(snap.policies), _last_generations(snap), snap.revision, prune=args.prune
        )
        if not args.dry_run:
            for i, c in enumerate(diff.changes):
                try:
                    await _push(client, c)
                except PeerError:
                    for done in diff.changes[:i]:  # a partial apply says what it did
                        print(f"pushed before the failure: {done.line()}", file=sys.stderr)
                    raise
        _print_diff(args, diff)
        return 0

    return _run(args, "apply", body)


async def _push(client: Any, c: Change) -> None:
    """One change, naming the generation the diff saw: another writer's change in between
    is refused (FAILED_PRECONDITION), never overwritten."""
    if c.policy is None:
        tomb = await client.remove(c.tenant_id, c.metric, expect_generation=c.base)
        c.generation = tomb.generation
        return
    body = c.policy.to_dict()
    if not c.explicit:
        del body["generation"]  # governord allocates it
    result = await client.put(body, expect_generation=c.base)
    c.generation, c.policy = result.policy.generation, result.policy
    _say_disagreements(result.disagreements)


def _say_disagreements(lines: tuple[str, ...]) -> None:
    """governord stored the put, but these watching nodes load its generation from their own
    files with other values and will refuse it: the operator hears it here, not only in
    governord's log."""
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


def _print_diff(args: argparse.Namespace, diff: Diff) -> None:
    if args.json:
        out = {
            "dry_run": bool(args.dry_run),
            "revision": diff.revision,
            "added": [c.to_json() for c in diff.of("added")],
            "changed": [c.to_json() for c in diff.of("changed")],
            "removed": [c.to_json() for c in diff.of("removed")],
            "unchanged": diff.unchanged,
            "not_in_file": diff.kept,
        }
        print(json.dumps(out, sort_keys=True))
        return
    for c in diff.changes:
        print(c.line())
    for name in diff.kept:
        print(f"  {name}  not in the file: kept (--prune removes it)")
    verb = "would push" if args.dry_run else "pushed"
    counts = ", ".join(f"{len(diff.of(k))} {k}" for k in ("added", "changed", "removed"))
    print(f"{verb}: {counts}; {diff.unchanged} unchanged")


def list_(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        snap = await client.list()
        if args.json:
            print(json.dumps(snap.to_wire(), sort_keys=True))
            return 0
        print(f"revision {snap.revision}")
        for p in snap.policies:
            name = scope_name(p.tenant_id, p.metric)
            print(f"{name}  generation {p.generation}: {policy_values(p)}")
        for t in snap.removed:
            print(f"{scope_name(t.tenant_id, t.metric)}  generation {t.generation}: removed")
        return 0

    return _run(args, "list", body)


def _metric(value: str, flag: str) -> str:
    return check_metric(value, field=flag, error=ConfigError)


def history(args: argparse.Namespace) -> int:
    metric = None if args.metric is None else _metric(args.metric, "--metric")

    async def body(client: Any) -> int:
        entries = await client.history(args.tenant_id, metric)
        if args.json:
            print(json.dumps({"history": [e.to_wire() for e in entries]}, sort_keys=True))
            return 0
        if not entries:
            print(f"{args.tenant_id}: no policy generations at governord")
        for e in entries:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.at_ms / 1000))
            what = "removed" if e.policy is None else policy_values(e.policy)
            print(f"{scope_name(e.tenant_id, e.metric)}  generation {e.generation}  {when}  {what}")
        return 0

    return _run(args, "history", body)


def rollback(args: argparse.Namespace) -> int:
    metric = _metric(args.metric, "metric")
    if args.to < 1:
        raise ConfigError("--to", f"must be a generation >= 1, got {args.to}")
    tenant = args.tenant_id
    if args.descriptor is not None:
        try:
            tenant = descriptor_tenant(tenant, args.descriptor, field="--descriptor")
        except RatemeshError as exc:
            raise ConfigError(exc.field, exc.problem) from exc

    async def body(client: Any) -> int:
        # History lists the tenant's descriptors' keys too: keep this key's only.
        entries = [e for e in await client.history(args.tenant_id, metric) if e.tenant_id == tenant]
        name = scope_name(tenant, metric)
        target = next((e for e in entries if e.generation == args.to), None)
        if target is None or target.policy is None:
            kept = ", ".join(str(e.generation) for e in entries if e.policy) or "none"
            raise ConfigError(
                "--to", f"{name} has no kept generation {args.to} to roll back to (kept: {kept})"
            )
        last = entries[-1]
        if last.policy is not None and last.policy.values() == target.policy.values():
            print(f"{name}: generation {last.generation} already has generation {args.to}'s values")
            return 0
        change = Change(
            "changed" if last.policy is not None else "added",
            tenant,
            metric,
            last.generation + 1,
            last.generation,
            target.policy,
            last.policy,
        )
        if not args.dry_run:
            body = {k: v for k, v in target.policy.to_dict().items() if k != "generation"}
            result = await client.put(body, expect_generation=last.generation)
            change.generation, change.policy = result.policy.generation, result.policy
            _say_disagreements(result.disagreements)
        if args.json:
            print(json.dumps({"dry_run": bool(args.dry_run), **change.to_json()}, sort_keys=True))
        else:
            print(change.line() + f"  (generation {args.to}'s values)")
        return 0

    return _run(args, "rollback", body)


SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "apply": apply,
    "preview": lambda args: preview_command(args, _connect),
    "list": list_,
    "history": history,
    "rollback": rollback,
}
