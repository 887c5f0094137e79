"""Is the record's database reachable? A probe on its own connection, for /health/ready.

Why its own connection: the log's writer thread owns the store's connection and a probe must
not run on it between two commits. The probe runs in a worker thread (a PostgreSQL that does
not answer must not stall the event loop), at most once per ``PROBE_EVERY_S`` whatever the
number of scrapes and probes asking (later askers get the last answer and its age), and each
attempt is bounded by ``PROBE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg

from ratemesh.operator import one_line

__all__ = ["PROBE_EVERY_S", "PROBE_TIMEOUT_S", "ProbeResult", "StoreProbe", "probe_for"]

PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    took_ms: float
    at: float  # time.monotonic() of the attempt
    error: str | None = None


class _Check(Protocol):
    def __call__(self) -> None: ...


class _Postgres:
    """``SELECT 1`` on a connection kept open between probes; reopened after a failure."""

    def __init__(self, dsn: str, application_name: str) -> None:
        self._dsn = dsn
        self._app = application_name
        self._conn: psycopg.Connection[Any] | None = None

    def __call__(self) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self._dsn,
                    autocommit=True,
                    connect_timeout=max(1, int(PROBE_TIMEOUT_S)),
                    application_name=self._app,
                    options=f"-c statement_timeout={int(PROBE_TIMEOUT_S * 1000)}",
                )
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Sqlite:
    """The file opens read-only and holds governord's schema table."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __call__(self) -> None:
        uri = Path(self._path).absolute().as_uri() + "?mode=ro"  # as_uri quotes ? and #
        conn = sqlite3.connect(uri, uri=True, timeout=PROBE_TIMEOUT_S)
        try:
            conn.execute("SELECT max(version) FROM governor_schema").fetchone()
        finally:
            conn.close()


def _memory() -> None:
    """The in-memory store (benchmarks) is always there."""


class StoreProbe:
    """The last answer to "can the store be reached", refreshed on demand."""

    def __init__(self, kind: str, check: _Check) -> None:
        self.kind = kind
        self._check = check
        self._last: ProbeResult | None = None
        self._running: asyncio.Future[ProbeResult] | None = None

    def _attempt(self) -> ProbeResult:
        t0 = time.monotonic()
        try:
            self._check()
        except (psycopg.Error, sqlite3.Error, OSError) as exc:
            return ProbeResult(False, (time.monotonic() - t0) * 1000, t0, one_line(exc))
        return ProbeResult(True, (time.monotonic() - t0) * 1000, t0)

    async def result(self) -> ProbeResult:
        now = time.monotonic()
        if self._last is not None and now - self._last.at < PROBE_EVERY_S:
            return self._last
        if self._running is None:  # one attempt at a time, whoever asks
            self._running = asyncio.ensure_future(asyncio.to_thread(self._attempt))
        running = self._running
        try:
            found = await asyncio.wait_for(asyncio.shield(running), PROBE_TIMEOUT_S + 0.5)
        except TimeoutError:
            return ProbeResult(False, (time.monotonic() - now) * 1000, now, "probe timed out")
        if self._running is running:
            self._running = None
        self._last = found
        return found

    def close(self) -> None:
        close = getattr(self._check, "close", None)
        if close is not None:
            close()


def probe_for(kind: str, target: str, application_name: str) -> StoreProbe:
    """The probe of a store named as ``GovernordConfig.store_kind()`` names it."""
    if kind == "postgres":
        return StoreProbe(kind, _Postgres(target, f"{application_name}-probe"))
    if kind == "sqlite":
        return StoreProbe(kind, _Sqlite(target))
    return StoreProbe(kind, _memory)
