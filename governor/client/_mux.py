"""The client end of Multiplex: many concurrent calls over one bidirectional stream.

Why: each gRPC message costs about as much CPU as a whole unary call, on both sides. A ``Mux``
keeps one stream per channel and credentials, a map of call id -> future, and a writer that
sends everything queued in one loop iteration as one message, so 16 callers cost one message
per round instead of 16 calls. When the stream breaks, every call in flight on it fails with
the stream's status (UNAVAILABLE when governord went away) and the next call opens a new
stream; ``Rpc.call`` resends the same bytes (same request id) as it does for a unary call.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc
from grpc import aio

from governor import wire

__all__ = ["CallFailed", "Mux", "status_of"]

Metadata = tuple[tuple[str, str], ...]
# A stream that ends with one of these and without governord's detail was broken by the
# transport, not refused by governord: its calls are resent like UNAVAILABLE ones.
_BROKEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}


class CallFailed(Exception):
    """A call's error status, before it becomes an SDK error. ``stream``: the whole Multiplex
    stream failed (not this call alone), e.g. UNIMPLEMENTED by an older governord."""

    def __init__(
        self, code: grpc.StatusCode, details: str, detail: dict[str, Any], *, stream: bool = False
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.detail = detail
        self.stream = stream


def status_of(err: grpc.RpcError) -> CallFailed:
    """A gRPC error as a CallFailed, with governord's detail from the trailing metadata."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    detail: dict[str, Any] = {}
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for k, v in trailing or ():
        if k == wire.ERROR_MD and isinstance(v, bytes):
            try:
                got = wire.unpack(v)
            except wire.WireError:
                continue
            if isinstance(got, dict):
                detail = got
    return CallFailed(code or grpc.StatusCode.UNKNOWN, details or "", detail)


def _code(name: Any) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[name] if isinstance(name, str) else grpc.StatusCode.UNKNOWN
    except KeyError:
        return grpc.StatusCode.UNKNOWN


class _Link:
    """One Multiplex call: its calls in flight, its writer and its reader."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.broken = False
        self._loop = asyncio.get_running_loop()
        self._outbox: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._writer = self._loop.create_task(self._write_loop(), name="governor-mux-writer")
        self._reader = self._loop.create_task(self._read_loop(), name="governor-mux-reader")

    def submit(self, cid: int, method: str, data: bytes) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self.pending[cid] = fut
        self._outbox.append({"id": cid, "method": method, "body": data})
        self._wake.set()
        return fut

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    out, self._outbox = self._outbox, []
                    for data in wire.pack_batch("calls", out):
                        await self.call.write(data)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the call ended under us: the reader learns why
            self.hang_up()

    async def _read_loop(self) -> None:
        failed: CallFailed
        try:
            while True:
                data = await self.call.read()
                if data is aio.EOF:
                    failed = CallFailed(grpc.StatusCode.UNAVAILABLE, "Multiplex ended", {})
                    break
                self._dispatch(data)
        except grpc.RpcError as err:
            failed = status_of(err)
            if not failed.detail and failed.code in _BROKEN:
                # not governord's answer but the transport's: the connection went away under
                # a write ("Internal error from Core"), a stream was reset, or we hung up
                why = f"the Multiplex stream broke ({failed.code.name}: {failed.details})"
                failed = CallFailed(grpc.StatusCode.UNAVAILABLE, why, {})
        except (wire.WireError, KeyError, TypeError, ValueError) as exc:
            failed = CallFailed(grpc.StatusCode.INTERNAL, f"bad Multiplex reply: {exc}", {})
        failed.stream = True
        self.fail_all(failed)

    def _dispatch(self, data: bytes) -> None:
        message = wire.unpack(data)
        pending = self.pending
        for entry in message["replies"]:
            fut = pending.pop(entry["id"], None)
            if fut is None or fut.done():
                continue  # its caller gave up (cancelled, or past its timeout)
            if "reply" in entry:
                fut.set_result(entry["reply"])
            else:
                detail = entry.get("error")
                detail = detail if isinstance(detail, dict) else {}
                details = str(detail.get("message", ""))
                fut.set_exception(CallFailed(_code(entry.get("code")), details, detail))

    def hang_up(self) -> None:
        """Stop using this stream; the reader then fails what is in flight on it."""
        self.broken = True
        if not self.call.done():
            self.call.cancel()

    def fail_all(self, failed: CallFailed) -> None:
        self.broken = True
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():  # one exception each: they are raised in different tasks
                fut.set_exception(
                    CallFailed(failed.code, failed.details, failed.detail, stream=failed.stream)
                )
        self._writer.cancel()
        if not self.call.done():
            self.call.cancel()

    async def close(self) -> None:
        self.hang_up()
        self.fail_all(CallFailed(grpc.StatusCode.CANCELLED, "the client closed", {}))
        for task in (self._writer, self._reader):
            task.cancel()
        await asyncio.gather(self._writer, self._reader, return_exceptions=True)


class Mux:
    """Multiplex for one set of credentials: one stream at a time, reopened after a break."""

    def __init__(self, channel: aio.Channel, metadata: Metadata) -> None:
        self._open = channel.stream_stream(wire.path(wire.MULTIPLEX))
        self._metadata = metadata
        self._link: _Link | None = None
        self._ids = itertools.count(1)
        self._closed = False

    def new_id(self) -> int:
        """A call id; a resend keeps its id (and its bytes)."""
        return next(self._ids)

    async def call(
        self, cid: int, method: str, data: bytes, timeout_s: float | None
    ) -> dict[str, Any]:
        """One call on the current stream; raises CallFailed."""
        if self._closed:
            raise CallFailed(grpc.StatusCode.CANCELLED, "the client is closed", {})
        link = self._link
        if link is None or link.broken:
            link = self._link = _Link(self._open(metadata=self._metadata))
        fut = link.submit(cid, method, data)
        try:
            if timeout_s is None:
                return await fut
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            why = f"no reply within {timeout_s} s"
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, why, {}) from None
        finally:
            link.pending.pop(cid, None)

    async def close(self) -> None:
        self._closed = True
        if self._link is not None:
            await self._link.close()
            self._link = None
