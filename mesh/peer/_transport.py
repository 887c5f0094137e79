"""The node's view of the network: one small Protocol, and the in-memory implementation.

The gRPC transport (`GrpcTransport`) and `MemoryTransport` below both satisfy `Transport`;
the node cannot tell them apart, which is what lets node tests run without sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from mesh.core.messages import Message, decode, encode

__all__ = ["Transport", "Deliver", "MemoryTransport", "MemoryNetwork"]

Deliver = Callable[[Message], None]


class Transport(Protocol):
    """Carries mesh messages between members, best effort (the protocol tolerates loss)."""

    def send(self, to: str, message: Message) -> bool:
        """Queue `message` for member `to`; False if it was dropped at once."""
        ...

    def set_peers(self, addresses: Mapping[str, str]) -> None:
        """The members and their addresses, as membership last said."""
        ...

    async def start(self) -> str:
        """Begin serving; returns the address peers should dial."""
        ...

    async def close(self, drain_s: float) -> None:
        """Stop accepting, let queued messages go for up to `drain_s`, then cancel."""
        ...

    async def flush(self, timeout_s: float) -> bool:
        """Wait, for at most `timeout_s`, until what was sent so far is on the wire; True
        if it is (False: time ran out with some of it still queued)."""
        ...

    def stats(self) -> dict[str, Any]: ...


class MemoryNetwork:
    """Members' delivery callbacks by id: the in-memory 'wire' (messages still encode)."""

    def __init__(self) -> None:
        self.members: dict[str, Deliver] = {}


class MemoryTransport:
    """A Transport over a MemoryNetwork on the running loop; encodes and decodes each
    message so the codec is exercised exactly as on the wire."""

    def __init__(self, network: MemoryNetwork, member_id: str, deliver: Deliver) -> None:
        self.network = network
        self.member_id = member_id
        self.deliver = deliver
        self.sent = 0
        self.dropped = 0

    def send(self, to: str, message: Message) -> bool:
        target = self.network.members.get(to)
        if target is None:
            self.dropped += 1
            return False
        self.sent += 1
        asyncio.get_running_loop().call_soon(target, decode(encode(message)))
        return True

    def set_peers(self, addresses: Mapping[str, str]) -> None:
        pass

    async def start(self) -> str:
        self.network.members[self.member_id] = self.deliver
        return f"memory:{self.member_id}"

    async def close(self, drain_s: float) -> None:
        self.network.members.pop(self.member_id, None)

    async def flush(self, timeout_s: float) -> bool:
        await asyncio.sleep(0)  # sends are delivered by the loop's next round
        return True

    def stats(self) -> dict[str, Any]:
        return {"sent": self.sent, "dropped": self.dropped}
