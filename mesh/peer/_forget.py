"""`mesh fleet forget-member NAME`: purge a decommissioned replica's spend-quota cells.

A replica's burn lives in two places: the cells each key's owner folds (one owner per key,
spread over the ring) and the shared-state tier's rows (Redis or PostgreSQL). So the
command asks one member for the ring, then calls ForgetMember on every member within one
deadline: each purges the cells it folds, and the shared tier's once (the first call that
reaches it; the others find nothing left). A name still in the ring is refused unless
forced: a live member's next publish writes its cumulative cells straight back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from mesh.config import TlsConfig
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.errors import MeshError, MessageError
from mesh.peer._fleet import FleetCalls, _addresses
from mesh.peer._identity import AUTH_MD, FORGET_EPOCH
from mesh.peer._link import open_channel
from mesh.peer._status import STATUS_CALLER, fetch_status, status_proof
from mesh.peer._wire import FORGET, MEMBER_MD, pack, translate, unpack

__all__ = ["StillAMember", "forget_fleet", "forget_member"]


class StillAMember(MeshError):
    """The name is in the ring: its cells would come straight back (`force` overrides)."""


async def forget_member(
    addr: str,
    name: str,
    *,
    target: str,
    tls: TlsConfig | None = None,
    fleet_secret: bytes | None = None,
    timeout_s: float = 5.0,
) -> dict[str, Any]:
    """One member's ForgetMember answer (the cells it dropped); raises PeerError."""
    md: tuple[tuple[str, str], ...] = ((MEMBER_MD, STATUS_CALLER),)
    if fleet_secret is not None:
        md = (*md, (AUTH_MD, status_proof(fleet_secret, target, FORGET_EPOCH)))
    async with open_channel(addr, tls, MAX_MESSAGE_BYTES) as channel:
        try:
            data = await channel.unary_unary(FORGET)(
                pack({"member": name}), timeout=timeout_s, metadata=md
            )
        except grpc.RpcError as exc:
            raise translate(exc, f"forget_member {addr}") from exc
    out = unpack(data, "forget_member")
    if not isinstance(out, dict):
        raise MessageError("forget_member", "the member's answer is not a map")
    return out


async def forget_fleet(
    addr: str,
    name: str,
    *,
    tls: TlsConfig | None = None,
    fleet_secret: bytes | None = None,
    target: str | None = None,
    timeout_s: float = 5.0,
    force: bool = False,
) -> list[dict[str, Any]]:
    """Every ring member's answer to ForgetMember(`name`), or why it gave none (`error`).
    Raises PeerError if `addr` does not answer, StillAMember if `name` is in its ring."""
    calls = FleetCalls(timeout_s)
    seed = await fetch_status(
        addr, tls=tls, timeout_s=timeout_s, fleet_secret=fleet_secret, target=target
    )
    addresses = _addresses(seed)
    if name in addresses and not force:
        raise StillAMember(
            "member",
            f"{name!r} is in the ring: its next publish would write its cells back "
            "(stop it first, or --force)",
        )
    addresses.pop(name, None)

    async def ask(member: str, member_addr: str) -> dict[str, Any]:
        row: dict[str, Any] = {"member_id": member, "addr": member_addr}
        try:
            answer = await calls.call(
                "forget_member",
                member,
                member_addr,
                lambda left: forget_member(
                    member_addr,
                    name,
                    target=member,
                    tls=tls,
                    fleet_secret=fleet_secret,
                    timeout_s=left,
                ),
            )
            row["folds_cells"] = _count(answer.get("folds_cells"))
            row["tier_cells"] = _count(answer.get("tier_cells"))
            if answer.get("tier_error") is not None:
                row["error"] = str(answer["tier_error"])[:200]
        except MeshError as exc:
            row["error"] = " ".join(str(exc).split())
        return row

    return list(await asyncio.gather(*(ask(m, a) for m, a in sorted(addresses.items()))))


def _count(value: Any) -> int:
    """A count from a member's answer (untrusted): a small non-negative int, else 0."""
    return value if isinstance(value, int) and 0 <= value < 1 << 53 else 0
