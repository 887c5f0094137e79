"""etcd membership against a real etcd: join, leave, lease expiry and an etcd restart each
change or keep the ring as specified, and every member agrees on the epoch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from mesh.membership import EtcdClient, EtcdMembership, MembershipView
from tests.mesh._etcd import EtcdServer

pytestmark = pytest.mark.slow  # a real etcd

TTL_S = 2  # etcd's minimum lease TTL


class _Member:
    def __init__(self, etcd: EtcdServer, member_id: str) -> None:
        self.client = EtcdClient((etcd.url,), timeout_s=1.0)
        self.source = EtcdMembership(
            self.client,
            prefix="/test/members/",
            member_id=member_id,
            addr=f"addr-{member_id}",
            lease_ttl_s=TTL_S,
            retry_s=0.1,
        )
        self.view = MembershipView()
        self.task = asyncio.get_running_loop().create_task(self.source.run(self._publish))

    def _publish(self, view: MembershipView) -> None:
        self.view = view

    async def halt(self) -> None:
        """Stop without leaving: the process hangs or dies; its lease must lapse."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.client.close()


async def _until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        assert loop.time() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.02)


def _agree(members: list[_Member], ids: set[str]) -> bool:
    views = [m.view for m in members]
    return (
        all(set(v.members) == ids and not v.stale for v in views)
        and len({v.epoch for v in views}) == 1
    )


def test_join_leave_expiry_and_restart(etcd: EtcdServer) -> None:
    async def main() -> None:
        a, b, c = (_Member(etcd, m) for m in "abc")
        await _until(lambda: _agree([a, b, c], {"a", "b", "c"}), 10, "all three joined")
        assert a.view.members["b"] == "addr-b"
        joined = a.view.epoch

        await c.source.leave()  # graceful: the key goes at once
        await _until(lambda: _agree([a, b], {"a", "b"}), 5, "c left")
        left = a.view.epoch
        assert left > joined
        await c.halt()

        await b.halt()  # no leave: only the lease lapsing removes b
        await asyncio.sleep(TTL_S / 2)
        assert set(a.view.members) == {"a", "b"}, "b must stay until its lease lapses"
        await _until(lambda: set(a.view.members) == {"a"}, 3 * TTL_S + 2, "b's lease lapsed")
        expired = a.view.epoch
        assert expired > left

        etcd.stop()  # the source is unreachable: keep the last ring, marked stale
        await _until(lambda: a.view.stale, 10, "membership marked stale")
        assert set(a.view.members) == {"a"} and a.view.epoch == expired
        etcd.start()  # same data dir: our lease and key survive, so the ring is kept
        await _until(lambda: not a.view.stale, 15, "membership fresh again")
        assert set(a.view.members) == {"a"}
        assert a.view.epoch == expired, "a restart must not change the ring or its epoch"

        d = _Member(etcd, "d")  # a late joiner computes the same epoch as the old member
        await _until(lambda: _agree([a, d], {"a", "d"}), 10, "d joined after the restart")
        assert a.view.epoch > expired
        await a.halt()
        await d.source.leave()
        await d.halt()

    asyncio.run(main())
