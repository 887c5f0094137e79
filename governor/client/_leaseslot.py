"""A `gov` slot that holds across machines: a governord lease on a concurrency limit.

With `GOVERNOR_ADDR` and `GOVERNOR_API_KEY` set, `gov run` and `slot()` take their slot as a
lease of class `<name>` on the node `gov` under the caller's tenant, whose limit for that
class is set to `max`: so at most `max` hold it across every machine that uses the name. The
lease lives with the SDK's session: a holder killed with SIGKILL stops heartbeating, and
governord frees the lease when the session's TTL runs out.

When governord does not answer, the caller falls back to the machine-local semaphore (still
a ceiling, on this machine only) and says so: the fleet-wide limit is the part given up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ._client import Lease
from ._errors import AcquireTimeout, GovernorClientError
from ._sync import SyncClient

__all__ = ["LeaseSlot", "GOV_NODE", "governord_addr", "CONNECT_TIMEOUT_S", "SESSION_TTL_MS"]

GOV_NODE = "gov"  # the node under the tenant whose limits are the gov slot names
CONNECT_TIMEOUT_S = 3.0  # past this, governord "does not answer": fall back, disclosed
SESSION_TTL_MS = 10_000  # a killed holder's lease is freed within this (governord's bounds)


def governord_addr(environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get("GOVERNOR_ADDR") or None


@dataclass
class LeaseSlot:
    """One lease of `name` under a `max` across the fleet; `take` returns None on success or
    the reason it could not (the caller then fails open or falls back, and says why)."""

    name: str
    max: int
    addr: str | None = None
    api_key: str | None = None
    ttl_ms: int = SESSION_TTL_MS
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    client: SyncClient | None = None
    lease: Lease | None = None
    unreachable: bool = False

    def take(self, window_s: float) -> str | None:
        try:
            self.client = SyncClient(
                self.addr,
                self.api_key,
                ttl_ms=self.ttl_ms,
                connect_timeout_s=self.connect_timeout_s,
            )
            c = self.client
            node = c._run(c.aio.create_node(GOV_NODE, ensure=True, limits={self.name: self.max}))
            c._run(c.aio.set_limit(node, self.name, self.max))
            self.lease = c._run(c.aio.acquire_at(node, self.name, timeout=window_s))
            return None
        except AcquireTimeout:
            self._close()
            return f"no {self.name!r} lease free in governord (max {self.max})"
        except (GovernorClientError, OSError) as exc:
            self.unreachable = True
            self._close()
            return f"governord unreachable ({type(exc).__name__}: {exc})"

    def give_back(self) -> None:
        c, lease = self.client, self.lease
        self.lease = None
        if c is not None and lease is not None:
            try:
                c._run(c.aio.release(lease))
            except GovernorClientError:
                pass  # the session's end frees it
        self._close()

    def _close(self) -> None:
        c, self.client = self.client, None
        if c is not None:
            try:
                c.close()
            except GovernorClientError:
                pass
