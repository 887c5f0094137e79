"""Membership from the config's list: fixed members, epoch 1, never stale."""

from __future__ import annotations

import asyncio

from mesh.membership._source import MembershipView, Publish

__all__ = ["StaticMembership"]


class StaticMembership:
    def __init__(self, members: dict[str, str]) -> None:
        self.members = dict(members)

    async def run(self, publish: Publish) -> None:
        publish(MembershipView(dict(self.members), 1, False))
        await asyncio.Event().wait()

    async def leave(self) -> None:
        pass  # a static list does not change when a member stops

    async def close(self) -> None:
        pass
