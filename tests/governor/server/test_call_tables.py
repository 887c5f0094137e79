"""The service's groups of calls name every unary method of the wire exactly once."""

from __future__ import annotations

import asyncio

from governor import wire
from governor.authority import Authority
from governor.config import GovernordConfig
from governor.server._calls import Steps
from governor.server._commit import CommitWaits
from governor.server._creditcalls import CreditCalls
from governor.server._nodecalls import NodeCalls
from governor.server._sessioncalls import SessionCalls
from governor.store import EventLog, MemoryBackend


def test_every_unary_method_has_one_call() -> None:
    loop = asyncio.new_event_loop()
    authority = Authority(EventLog(MemoryBackend()))
    try:
        steps = Steps(authority, CommitWaits(authority, loop), loop)
        tables = [
            SessionCalls(steps, GovernordConfig()).calls(),
            NodeCalls(steps).calls(),
            CreditCalls(steps).calls(),
        ]
        names = [name for table in tables for name in table]
        unary = sorted(n for n, m in wire.METHODS.items() if not m.stream)
        assert sorted(names) == unary  # none missing, none twice
    finally:
        authority.close()
        loop.close()
