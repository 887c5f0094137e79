"""`mesh status --fleet`: ask one member for the ring, then every member, in parallel and
within one deadline, for the generation it enforces per limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mesh.config import TlsConfig
from mesh.errors import MeshError, MessageError, PeerUnavailable
from mesh.peer._status import fetch_status
from mesh.telemetry import MemberAnswer, enforced_of
from ratemesh.checks import check_address

__all__ = ["fetch_fleet", "FleetCalls", "FLEET_MEMBERS_MAX", "FLEET_PARALLEL_MAX"]

FLEET_MEMBERS_MAX = 4096  # members one fleet status asks; a longer list is a bad answer
FLEET_PARALLEL_MAX = 64  # Status calls in flight at once

T = TypeVar("T")


class FleetCalls:
    """One fleet command's calls to its members: at most FLEET_PARALLEL_MAX in flight, each
    to a checked address, within what is left of one deadline (`time_left`)."""

    def __init__(self, timeout_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + timeout_s
        self.gate = asyncio.Semaphore(FLEET_PARALLEL_MAX)

    async def call(
        self, rpc: str, member: str, member_addr: str, send: Callable[[float], Awaitable[T]]
    ) -> T:
        """`send(timeout_s)` to `member` at `member_addr` (from the ring's addresses: a
        peer's word, checked here) once a slot is free and time is left."""
        check_address(f"membership.addresses.{member}", member_addr, error=MessageError)
        async with self.gate:
            left = self.deadline - self.loop.time()
            if left <= 0:
                raise PeerUnavailable(rpc, f"{member_addr}: no time left")
            return await send(left)


async def fetch_fleet(
    addr: str,
    *,
    tls: TlsConfig | None = None,
    fleet_secret: bytes | None = None,
    target: str | None = None,
    timeout_s: float = 5.0,
) -> list[MemberAnswer]:
    """Every ring member `addr`'s member knows, with what it enforces or why it did not
    answer. Raises PeerError if `addr` itself does not answer, MessageError if its answer
    does not list the ring's addresses; past `timeout_s` every member not yet heard from
    is unreachable."""
    calls = FleetCalls(timeout_s)
    seed = await fetch_status(
        addr, tls=tls, timeout_s=timeout_s, fleet_secret=fleet_secret, target=target
    )
    addresses = _addresses(seed)

    async def ask(member: str, member_addr: str) -> MemberAnswer:
        try:
            if member == seed.get("member_id"):
                status = seed  # asked already
            else:
                status = await calls.call(
                    "status",
                    member,
                    member_addr,
                    lambda left: fetch_status(
                        member_addr,
                        tls=tls,
                        timeout_s=left,
                        fleet_secret=fleet_secret,
                        target=member,
                    ),
                )
            if status.get("member_id") != member:
                raise MessageError(
                    "member_id", f"{member_addr} answered as {status.get('member_id')!r}"
                )
            return MemberAnswer(member, member_addr, enforced_of(status))
        except MeshError as exc:
            return MemberAnswer(member, member_addr, None, " ".join(str(exc).split()))

    return list(await asyncio.gather(*(ask(m, a) for m, a in sorted(addresses.items()))))


def _addresses(status: dict[str, Any]) -> dict[str, str]:
    members = status.get("membership")
    raw = members.get("addresses") if isinstance(members, dict) else None
    if not isinstance(raw, dict):
        raise MessageError(
            "membership.addresses", "the member's status lists no addresses (an older version?)"
        )
    if len(raw) > FLEET_MEMBERS_MAX:
        raise MessageError("membership.addresses", f"more than {FLEET_MEMBERS_MAX} members")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise MessageError("membership.addresses", "must map member ids to addresses")
    return dict(raw)
