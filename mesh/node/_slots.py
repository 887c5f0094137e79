"""The node's faces of in-flight slots and chunked egress (docs/api.md).

`Slot` is what `Mesh.slot` returns: a context manager (`with`, `async with`) that acquires
one slot of a concurrency limit on enter, optionally waiting a bounded time for one, gives
the `SlotVerdict` to the block, and releases the slot on exit if it was taken. A denial is
a value: the block sees `allowed` False and the slot is not held.

`Egress` is what `Mesh.egress` returns: a byte metric charged in chunks as a response
streams (seed 004's transfer chunks). `sent(n)` says n more bytes are about to go out; it
charges whole chunks ahead of what was sent, so the hot path pays one admission per chunk,
not per write. On exit the charged-but-unsent part is refunded (a short send).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from mesh.core.concurrency import SlotVerdict
from mesh.core.verdict import Verdict
from mesh.errors import ConfigError
from ratemesh.checks import check_int

if TYPE_CHECKING:
    from mesh.node._mesh import Mesh

__all__ = ["EGRESS_CHUNK_DEFAULT", "Egress", "SLOT_POLL_S", "Slot"]

# How often a waiting slot asks again: a release frees a slot between two polls.
SLOT_POLL_S = 0.005
# Seed 004's egress scheduling chunk runs 256 KiB - 1 MiB; the low end keeps the overshoot
# a denied stream leaves unspent small.
EGRESS_CHUNK_DEFAULT = 256 * 1024


class Slot:
    """One slot of (`tenant`, `metric`), held for a `with` / `async with` block."""

    def __init__(self, mesh: Mesh, tenant: str, metric: str, timeout_s: float) -> None:
        if not timeout_s >= 0:
            raise ConfigError("timeout_s", f"must be >= 0, got {timeout_s!r}")
        self.mesh, self.tenant, self.metric, self.timeout_s = mesh, tenant, metric, timeout_s
        self.verdict: SlotVerdict | None = None

    def _try(self) -> SlotVerdict:
        return self.mesh.acquire_slot(self.tenant, self.metric)

    def __enter__(self) -> SlotVerdict:
        v = self._try()
        end = time.monotonic() + self.timeout_s
        while not v.allowed and time.monotonic() < end:
            time.sleep(SLOT_POLL_S)
            v = self._try()
        self.verdict = v
        return v

    def __exit__(self, *exc: object) -> None:
        self._release()

    async def __aenter__(self) -> SlotVerdict:
        v = self._try()
        end = time.monotonic() + self.timeout_s
        while not v.allowed and time.monotonic() < end:
            await asyncio.sleep(SLOT_POLL_S)
            v = self._try()
        self.verdict = v
        return v

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        v, self.verdict = self.verdict, None
        if v is not None and v.allowed:
            self.mesh.release_slot(v.lease)


class Egress:
    """A streamed response's bytes, charged in chunks ahead and the unsent part refunded."""

    def __init__(
        self, mesh: Mesh, tenant: str, metric: str, expected_bytes: int, chunk: int
    ) -> None:
        self.mesh, self.tenant, self.metric = mesh, tenant, metric
        self.expected = check_int("expected_bytes", expected_bytes, minimum=0)
        self.chunk = check_int("chunk", chunk, minimum=1)
        self.charged = 0  # bytes charged so far
        self.sent_bytes = 0  # bytes the caller said went out
        self.refunded = 0

    def sent(self, n: int) -> Verdict | None:
        """n more bytes are about to go out: None if what was charged covers them, else the
        verdict of charging the next chunk (a chunk, or up to the rest of `expected_bytes`,
        at least n). Denied: nothing is recorded; wait and ask again, or stop the stream."""
        check_int("n", n, minimum=0)
        need = self.sent_bytes + n - self.charged
        if need <= 0:
            self.sent_bytes += n
            return None
        step = max(need, min(self.chunk, max(self.expected - self.charged, 0)))
        step = max(step, min(self.chunk, need))
        v = self.mesh.charge(self.tenant, self.metric, step)
        if v.allowed:
            self.charged += step
            self.sent_bytes += n
        return v

    def close(self) -> int:
        """Refund what was charged and not sent; the bytes refunded (once)."""
        back = self.charged - self.sent_bytes - self.refunded
        if back > 0:
            self.mesh.refund(self.tenant, self.metric, back)
            self.refunded += back
        return back

    def __enter__(self) -> Egress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Egress:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
