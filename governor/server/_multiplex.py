"""Multiplex: one bidirectional stream that carries batches of the short calls.

Why: a gRPC message costs about as much CPU as a whole unary call, so a client with many
concurrent callers pays that cost once per batch instead of once per call. Each call of a batch
runs as its own task through ``GovernorService.run``, the code a unary call runs (check, auth
with the stream's credentials, in-flight idempotency, one engine step, wait for its commit), so
there is one implementation of each call's semantics. Calls of a batch wait for their commits
concurrently; replies that are ready in the same loop iteration leave in one message.

A batch that cannot be answered call by call (see ``wire.check_batch``) fails the stream with
INVALID_ARGUMENT naming the field; nothing of it runs. On drain the stream stops reading, lets
its running calls reply, and ends UNAVAILABLE so the client reconnects and resends. A call
still running when its stream breaks runs on to the end, so a resend of its request id waits
for it and gets the same answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
from grpc import aio

from governor import wire

from ._status import Fail

__all__ = ["Metadata", "MuxStream", "RUNNING_MAX"]

Metadata = dict[str, Any]  # a call's invocation metadata (a Multiplex call: its stream's)
RUNNING_MAX = 65_536  # calls running on one stream (as INFLIGHT_MAX); more are refused: busy
_ORPHANS: set[asyncio.Task[None]] = set()  # calls that outlive their stream run to the end


class _Runner(Protocol):
    async def run(self, method: wire.Method, raw: bytes, md: Metadata) -> dict[str, Any]: ...


class MuxStream:
    """One open Multiplex call on the server."""

    def __init__(self, service: _Runner, context: aio.ServicerContext[bytes, bytes]) -> None:
        self._service = service
        self._context = context
        self._md: Metadata = dict(context.invocation_metadata() or ())
        self._running: dict[int, asyncio.Task[None]] = {}
        self._outbox: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._accepting = True
        self._closing = False
        self.code = grpc.StatusCode.OK

    async def serve(self, requests: AsyncIterator[bytes], drain: asyncio.Event) -> None:
        """Run the stream to its end (``code``: the status it ended with)."""
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._writer())
        reader = loop.create_task(self._reader(requests))
        drained = loop.create_task(drain.wait())
        try:
            await asyncio.wait((reader, drained), return_when=asyncio.FIRST_COMPLETED)
            self._accepting = False
            if reader.done():
                fail = reader.result()
            else:
                fail = Fail(
                    grpc.StatusCode.UNAVAILABLE, "draining", "governord is stopping: resend"
                )
            while self._running:  # every call that started replies before the stream ends
                await asyncio.wait(list(self._running.values()))
            self._closing = True
            self._wake.set()
            await writer
            if fail is not None:
                self.code = fail.code
                md = ((wire.ERROR_MD, wire.pack(fail.detail)),)
                await self._context.abort(fail.code, fail.detail["message"], md)
        except asyncio.CancelledError:
            self.code = grpc.StatusCode.CANCELLED
            raise
        finally:
            for task in (reader, drained, writer):
                task.cancel()
            for task in self._running.values():  # the stream was cancelled under them
                _ORPHANS.add(task)
                task.add_done_callback(_ORPHANS.discard)

    async def _reader(self, requests: AsyncIterator[bytes]) -> Fail | None:
        async for data in requests:
            if not self._accepting:
                return None  # draining: the stream ends UNAVAILABLE and the client resends
            try:
                message = wire.unpack(data)
            except wire.WireError as exc:
                return _malformed("batch", f"batch: {str(exc).removeprefix('body: ')}")
            try:
                calls = wire.check_batch(message)
            except wire.WireError as exc:
                return _malformed(exc.field, str(exc))
            for i, call in enumerate(calls):
                if call.id in self._running:
                    field = f"calls[{i}].id"
                    return _malformed(field, f"{field}: id {call.id} is still running")
            for call in calls:
                self._start(call)
        return None

    def _start(self, call: wire.Muxed) -> None:
        if call.method is None:
            assert call.error is not None
            self._send_fail(call.id, _malformed(call.error.field, str(call.error)))
        elif len(self._running) >= RUNNING_MAX:
            why = f"more than {RUNNING_MAX} calls running on this stream"
            self._send_fail(call.id, Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", why))
        else:
            task = asyncio.get_running_loop().create_task(
                self._one(call.id, call.method, call.body)
            )
            self._running[call.id] = task

    async def _one(self, cid: int, method: wire.Method, body: bytes) -> None:
        try:
            reply = await self._service.run(method, body, self._md)
        except Fail as f:
            self._send_fail(cid, f)
        except Exception as exc:  # noqa: BLE001 - a bug: answer it, never leave a caller waiting
            self._send_fail(cid, Fail(grpc.StatusCode.INTERNAL, "internal", repr(exc)))
        else:
            self._send({"id": cid, "reply": reply})
        finally:
            self._running.pop(cid, None)

    def _send_fail(self, cid: int, fail: Fail) -> None:
        self._send({"id": cid, "code": fail.code.name, "error": fail.detail})

    def _send(self, entry: dict[str, Any]) -> None:
        self._outbox.append(entry)
        self._wake.set()

    async def _writer(self) -> None:
        """Everything ready since the last write leaves in one message (split if too large)."""
        while True:
            if not self._outbox:
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            out, self._outbox = self._outbox, []
            try:
                for data in wire.pack_batch("replies", out):
                    await self._context.write(_fit(data))
            except Exception:  # noqa: BLE001 - the stream ended under us; serve() finishes it
                self._closing = True
                return


def _malformed(field: str, message: str) -> Fail:
    return Fail(grpc.StatusCode.INVALID_ARGUMENT, "malformed", message, field=field)


def _fit(data: bytes) -> bytes:
    """A message too large for the transport: its one reply becomes a RESOURCE_EXHAUSTED."""
    if len(data) <= wire.MESSAGE_BYTES_MAX:
        return data
    (entry,) = wire.unpack(data)["replies"]
    message = f"the reply is larger than {wire.MESSAGE_BYTES_MAX} bytes"
    error = {"reason": "too_large", "message": message}
    return wire.pack(
        {
            "v": wire.SCHEMA_VERSION,
            "replies": [{"id": entry["id"], "code": "RESOURCE_EXHAUSTED", "error": error}],
        }
    )
