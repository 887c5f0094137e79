"""The node's probes of what it depends on, every PROBE_INTERVAL_S, into `Dependencies`.

Each probe reads state the node keeps anyway (the policy feed's last answer, the reload's
last refusal, the views suspended for an unreachable owner) or, for strict limits, opens
the governord session the credit calls would use, so a wrong key or an unreachable
governord is said before the first strict request finds it. A change is logged once
(`Dependencies.observe`); readiness (`ready_reasons`) waits for policies and a first answer
from the coordinator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mesh.core.verdict import Suspension
from mesh.node._driver import NodeDriver
from mesh.telemetry._dependencies import Dependencies

__all__ = ["PROBE_INTERVAL_S", "OWNERS_NAMED_MAX", "DependencyWatch", "ready_reasons"]

log = logging.getLogger("mesh.node")
PROBE_INTERVAL_S = 0.25  # a change is said within this (plus one probe's time)
SESSION_PROBE_S = 2.0  # opening governord's session for the probe gives up after this
# After a failed session probe, the next waits this long: a fleet of nodes with a wrong key
# does not ask governord four times a second each.
SESSION_RETRY_S = 2.0
NOT_ANSWERED_S = 1.0  # a first call still unanswered after this is said as failing
OWNERS_NAMED_MAX = 5  # owners named in one reason; the count says how many more


class DependencyWatch:
    """Probes `driver`'s dependencies into `deps` until cancelled (the node's task)."""

    def __init__(self, driver: NodeDriver, deps: Dependencies) -> None:
        self.driver = driver
        self.deps = deps
        self.started_s = deps.clock_s()
        self._session_at = 0.0  # clock_s before which the governord probe waits
        self.coordinator_answered = False  # the feed has applied a snapshot at least once
        if driver.feed is not None:
            deps.declare("coordinator")
        if driver.credit is not None:
            deps.declare("governord")
        if driver.reloader is not None:
            deps.declare("policy_file")
        deps.declare("owners")

    async def run(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def probe(self) -> None:
        """One round of every probe (none once the node is closing: its leave is said)."""
        if self.driver.closing:
            return
        self._coordinator()
        self._policy_file()
        self._owners()
        await self._governord()

    def _coordinator(self) -> None:
        feed = self.driver.feed
        if feed is None:
            return
        if feed.reachable:
            self.coordinator_answered = True
            self.deps.observe("coordinator", True)
        elif feed.last_error:
            addr = getattr(feed.source, "addr", None)
            self.deps.observe("coordinator", False, feed.last_error, addr=addr)
        elif self.deps.clock_s() - self.started_s >= NOT_ANSWERED_S:
            # the first call is still resending (its own deadline is longer): say so now
            addr = getattr(feed.source, "addr", None)
            why = f"no answer within {NOT_ANSWERED_S:g} s; still trying"
            self.deps.observe("coordinator", False, why, addr=addr)

    def _policy_file(self) -> None:
        reloader = self.driver.reloader
        if reloader is None:
            return
        error = reloader.stats.last_error
        self.deps.observe("policy_file", not error, error, file=reloader.path)

    def _owners(self) -> None:
        """Owners whose keys' views are suspended `owner_unreachable` here: one line when the
        set of such owners changes, not one per denial."""
        m = self.driver.member
        owners: dict[str, int] = {}
        with self.driver.lock:
            # the views the tick watches: a suspended one has unacknowledged usage, so it is
            # among them; idle views (most of a large fleet's) are not scanned
            for v in m.reporter._live.values():
                if v.no.suspended is Suspension.OWNER_UNREACHABLE:
                    who = v.owner or "unknown"
                    owners[who] = owners.get(who, 0) + 1
        if not owners:
            self.deps.observe("owners", True)
            return
        named = sorted(owners)[:OWNERS_NAMED_MAX]
        more = len(owners) - len(named)
        reason = f"owner_unreachable: {', '.join(named)}" + (f" and {more} more" if more else "")
        self.deps.observe("owners", False, reason, keys=sum(owners.values()))

    async def _governord(self) -> None:
        credit = self.driver.credit
        if credit is None or self.driver.closing or self.deps.clock_s() < self._session_at:
            return
        try:
            await asyncio.wait_for(credit.session(), SESSION_PROBE_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is the dependency's state
            self._session_at = self.deps.clock_s() + SESSION_RETRY_S
            self.deps.observe("governord", False, _why(exc), addr=credit.config.governord)
        else:
            self.deps.observe("governord", True)

    def ready_reasons(self) -> list[str]:
        return ready_reasons(self.driver, self.coordinator_answered)


def ready_reasons(driver: NodeDriver, coordinator_answered: bool) -> list[str]:
    """Why the node is not ready to serve ([] when it is): closing, no policy loaded, or a
    configured coordinator that has not answered yet (every request would be
    `policy_unknown` until it does)."""
    out = []
    if driver.closing:
        out.append("closing")
    if driver.feed is not None and not coordinator_answered:
        out.append(f"coordinator not answered yet: {driver.feed.last_error or 'dialling'}")
    if not driver.member.policies.declared():
        out.append("no policies loaded")
    return out


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    code: Any = getattr(exc, "code", "")
    return f"{code}: {text}" if code and code not in text else text
