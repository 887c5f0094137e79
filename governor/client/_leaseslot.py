"""A `gov` slot that holds across machines: a governord lease on a concurrency limit.

With `GOVERNOR_ADDR` and `GOVERNOR_API_KEY` set, `gov run` and `slot()` take their slot as a
lease of class `<name>` on the node `gov` under the caller's tenant, whose limit for that
class is set to `max`: so at most `max` hold it across every machine that uses the name. The
lease lives with the SDK's session: a holder killed with SIGKILL stops heartbeating, and
governord frees the lease when the session's TTL runs out.

When governord does not answer, `slot()` falls back to the machine-local semaphore (still
a ceiling, on this machine only) and says so: the fleet-wide limit is the part given up.
`gov` checks first (`LeaseSlot.check`) and stops instead, naming the variable at fault.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from governor.gov import Cooldown
from ratemesh.errors import ConfigError

from ._client import Lease
from ._errors import AcquireTimeout, AuthError, GovernorClientError, ScopeError
from ._sync import SyncClient

__all__ = [
    "CONNECT_TIMEOUT_S",
    "FLEET",
    "GOV_NODE",
    "GovernordUnreachable",
    "SESSION_TTL_MS",
    "LeaseSlot",
    "fleet_cooldown",
    "governord_addr",
]

GOV_NODE = "gov"  # the node under the tenant whose limits are the gov slot names
CONNECT_TIMEOUT_S = 3.0  # past this, governord "does not answer": fall back, disclosed
SESSION_TTL_MS = 10_000  # a killed holder's lease is freed within this (governord's bounds)
FLEET = "all"  # the cooldown name on the gov node that backs every name off


def fleet_cooldown(environ: dict[str, str] | None = None) -> bool:
    """Whether cooldowns go through governord to every machine (GOV_FLEET_COOLDOWN=1): opt-in."""
    env = os.environ if environ is None else environ
    return env.get("GOV_FLEET_COOLDOWN", "").lower() in ("1", "true", "yes")


def governord_addr(environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get("GOVERNOR_ADDR") or None


class GovernordUnreachable(Exception):
    """GOVERNOR_ADDR is set and governord does not answer there (not the operator's typo,
    but not something `gov` papers over with this machine's slots either)."""


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
    node_id: int | None = None

    def _connect(self) -> SyncClient:
        if self.client is None:
            self.client = SyncClient(
                self.addr,
                self.api_key,
                ttl_ms=self.ttl_ms,
                connect_timeout_s=self.connect_timeout_s,
            )
            c = self.client
            self.node_id = c._run(
                c.aio.create_node(GOV_NODE, ensure=True)
            )  # the limit is set by `take`: its max is the caller's
        return self.client

    def check(self) -> None:
        """Open the session now, so a configured governord that is wrong or silent is said
        before anything runs (`gov`): ConfigError naming GOVERNOR_ADDR or GOVERNOR_API_KEY
        for the operator's mistake, GovernordUnreachable when nothing answers."""
        where = self.addr or governord_addr() or ""
        if "://" in where:
            raise ConfigError(
                "GOVERNOR_ADDR",
                f"{where!r} is a URL; governord takes host:port (it speaks gRPC, not HTTP)",
            )
        try:
            self._connect()
        except ConfigError as exc:
            raise ConfigError("GOVERNOR_ADDR", exc.problem) from exc
        except (AuthError, ScopeError) as exc:
            self._close()
            raise ConfigError(
                "GOVERNOR_API_KEY", f"governord at {where} refused it ({exc})"
            ) from exc
        except (GovernorClientError, OSError) as exc:
            self._close()
            raise GovernordUnreachable(
                f"governord at {where} (GOVERNOR_ADDR) does not answer: {exc}"
            ) from exc

    def node_info(self) -> dict[str, Any]:
        """The gov node as governord holds it: each name's limit, leases held and waiting."""
        c = self._connect()
        assert self.node_id is not None
        info: dict[str, Any] = c._run(c.aio.get_node(self.node_id))
        return info

    def mirror_cooldowns(self, cooldown: Cooldown) -> str | None:
        """Copy the fleet's live cooldowns for this name (and `all`) from the gov node into
        this machine's cooldown, which the wait then honours. None, or why it could not
        (governord unreachable: the caller goes on with what this machine knows)."""
        try:
            c = self._connect()
            assert self.node_id is not None
            info = c._run(c.aio.get_node(self.node_id))
        except (GovernorClientError, OSError) as exc:
            self.unreachable = True
            self._close()
            return f"governord unreachable ({type(exc).__name__}: {exc})"
        held = info.get("cooldowns") or {}
        cooldown.mirror(self.name, held.get(FLEET, 0) / 1000, held.get(self.name, 0) / 1000)
        return None

    def publish_cooldown(
        self, seconds: float, name_only: bool, *, replace: bool = False
    ) -> str | None:
        """Back every machine off through governord. None, or why not (fail-open: this
        machine's own cooldown is set either way)."""
        try:
            c = self._connect()
            assert self.node_id is not None
            name = self.name if name_only else FLEET
            c._run(c.aio.set_cooldown(self.node_id, name, seconds, replace=replace))
            return None
        except (GovernorClientError, OSError) as exc:
            return f"not published through governord ({type(exc).__name__}: {exc})"

    def take(self, window_s: float) -> str | None:
        try:
            c = self._connect()
            assert self.node_id is not None
            node = self.node_id
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
