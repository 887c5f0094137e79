"""governord's health: liveness and readiness, as JSON and as an HTTP status.

* **live** - the process answers and its record keeps up: no events waiting for a commit for
  longer than ``COMMIT_STALL_S``. (A failed commit stops the process at once, status 70, so a
  wedged writer is the one way to be alive and useless.) A supervisor restarts a process that is
  not live.
* **ready** - live, the store answers its own probe (``_probe``), this process is the leader,
  and it is not draining. A load balancer sends calls only to a ready governord.

Leadership: on SQLite governord runs alone and always leads. On PostgreSQL a standby (no engine
yet: ``authority`` is None) is live but not ready, and its report names the leader it sends
clients to (docs/failover.md). ``/health`` answers 200 when ready and 503 otherwise;
``/health/live`` and ``/health/ready`` answer one question each, for Kubernetes probes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from governor.authority import Authority

from ._probe import StoreProbe

__all__ = ["COMMIT_STALL_S", "Health"]

COMMIT_STALL_S = 10.0  # events waiting this long for their commit: the writer is wedged


def _alone() -> dict[str, Any]:
    return {"role": "leader", "leader": None, "epoch": None}


class Health:
    def __init__(
        self,
        authority: Authority | None,
        probe: StoreProbe,
        *,
        draining: Callable[[], bool],
        facts: dict[str, Any] | None = None,
        stall_after_s: float = COMMIT_STALL_S,
        leadership: Callable[[], dict[str, Any]] = _alone,
    ) -> None:
        self._authority = authority
        self._leadership = leadership
        self._probe = probe
        self._draining = draining
        self._facts = dict(facts or {})  # listen, tls, tenants: what the page repeats
        self._stall_after_s = stall_after_s
        self._started = time.monotonic()
        self._last_commit = time.monotonic()
        if authority is not None:
            authority.log.commit_listeners.append(self._on_commit)

    def _on_commit(self, _seq: int, _n: int, _took: float) -> None:
        self._last_commit = time.monotonic()  # the writer thread; a float store is atomic

    def _writer(self) -> dict[str, Any]:
        if self._authority is None:  # a standby writes nothing
            return {"ok": True, "committed_seq": None, "pending_events": 0}
        committed = self._authority.log.committed_seq
        pending = max(0, self._authority.engine.last_seq - committed)
        since = time.monotonic() - self._last_commit
        stalled = pending > 0 and since > self._stall_after_s
        return {
            "ok": not stalled,
            "committed_seq": committed,
            "pending_events": pending,
            "since_last_commit_s": round(since, 3),
            "stall_after_s": self._stall_after_s,
        }

    async def report(self) -> dict[str, Any]:
        """The whole answer: ``live``, ``ready`` and each check with its evidence."""
        writer = self._writer()
        probe = await self._probe.result()
        store = {
            "ok": probe.ok,
            "kind": self._probe.kind,
            "probe_ms": round(probe.took_ms, 3),
            "probe_age_s": round(time.monotonic() - probe.at, 3),
        }
        if probe.error is not None:
            store["error"] = probe.error
        draining = self._draining()
        lead = self._leadership()
        checks = {
            "writer": writer,
            "store": store,
            "leader": {"ok": lead["role"] == "leader", **lead},
            "serving": {"ok": not draining, "draining": draining},
        }
        live = writer["ok"]
        ready = live and all(c["ok"] for c in checks.values())
        return {
            "status": "ready" if ready else ("live" if live else "not_live"),
            "live": live,
            "ready": ready,
            "role": lead["role"],
            "checks": checks,
            "uptime_s": round(time.monotonic() - self._started, 3),
            **self._facts,
        }
