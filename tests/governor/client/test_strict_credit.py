"""StrictCredit against a real governord: spends locally, and when governord is gone it spends
what it holds until the local expiry, then fails closed with ``governor_unreachable``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.client import Client, StrictCredit
from ratemesh.credit import GOVERNOR_UNREACHABLE, CreditConfig
from tests.governor._daemon import KEYS, Daemon, running

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


def test_spends_what_it_holds_then_fails_closed_when_governord_is_gone(daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(daemon.addr, KEYS["KEY_A"], ttl_ms=1_000) as client:
            node = await client.create_node("strict", rates={"http": (0, 30)})
            config = CreditConfig(block_min=20, epsilon_ms=20)
            credit = StrictCredit(client, node, "http", config)
            first = await credit.admit(1, timeout_s=5.0)
            assert first.admitted
            (block,) = credit.holder.blocks.values()
            assert block.units == 20  # the block size floor, within the burst
            await asyncio.to_thread(daemon.kill)
            after_kill, verdict = 0, first
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                verdict = credit.try_admit(1)
                if verdict.admitted:
                    now_ms = time.monotonic_ns() // 1_000_000
                    assert now_ms < block.expires_at_ms  # never past the local expiry
                    after_kill += 1
                elif verdict.reason == GOVERNOR_UNREACHABLE:
                    break
                await asyncio.sleep(0.01)
            assert 0 < after_kill <= 19  # it spent what it held, nothing more
            assert verdict.reason == GOVERNOR_UNREACHABLE
            waited = await credit.admit(1, timeout_s=0.2)  # waits up to the deadline, denies
            assert not waited.admitted and waited.reason == GOVERNOR_UNREACHABLE
            await credit.close()

    asyncio.run(scenario())


def test_credit_is_returned_when_the_worker_leaves(daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(daemon.addr, KEYS["KEY_A"]) as client:
            node = await client.create_node("strict", rates={"http": (0, 50)})
            async with StrictCredit(client, node, "http", CreditConfig(block_min=10)) as credit:
                assert (await credit.admit(3, timeout_s=5.0)).admitted
            info = await client.get_node(node)
            # 3 admitted; the rest of the block came back (rate 0: nothing else refills it)
            assert info["credit"]["http"] == {"level": 47, "outstanding": 0}
            assert credit.reserves == 1 and credit.returns == 1

    asyncio.run(scenario())
