"""A TCP proxy that delays, blackholes, refuses or cuts what passes through it, changed while it
runs: the one fault-injecting proxy of the tests and the benchmarks.

It models the network between a governord and its PostgreSQL, between a client and a
governord, or between two mesh members: a slow link (`set_delay_ms`), a silent partition
(`blackhole`: nothing is forwarded, nothing is closed, as a dead network looks), a crash of the
far side or a middlebox reset (`cut`: every open connection is reset now, new ones are
accepted), and a loud partition (`partition`: every connection is reset and new ones are reset
at once, as a host that answers with RST; `refuse` for the second half alone). `heal` undoes
them all. It speaks bytes, not protocols, so PostgreSQL's wire protocol and gRPC's HTTP/2 both
pass unchanged.

The proxy runs its own asyncio loop in its own daemon thread, so it is used the same way from
sync code and from inside a running asyncio program (whose loop it never touches); each
control call returns once the proxy's loop has applied it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from ratemesh.checks import address_parts
from ratemesh.errors import ConfigError

CONNECTIONS_MAX = 256  # open connections; one more is accepted and reset at once
BUFFERED_BYTES_MAX = 4 << 20  # held per connection in each direction; reading pauses at it
READ_CHUNK_BYTES = 64 << 10  # one read from a socket: the unit that is delayed
DELAY_MS_MAX = 600_000  # a longer delay is a blackhole; say so with `blackhole(True)`
CONNECT_TIMEOUT_S = 10.0  # to the target, once the proxy lets a new connection through
CONTROL_TIMEOUT_S = 10.0  # a control call waits this long for the proxy's loop

T = TypeVar("T")


class ProxyError(RuntimeError):
    """The proxy was used wrongly (not started, closed, a bad argument) or could not bind."""


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """A snapshot of what the proxy holds and has done."""

    connections_open: int
    connections_accepted: int
    connections_refused: int  # beyond `connections_max`, or while `refuse(True)`
    bytes_forwarded: int  # both directions, written to the far side
    bytes_buffered: int  # held now (read, not yet written), all connections


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox reset looks."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed
    writer.transport.abort()


class _Pipe:
    """One direction of one connection: chunks read, held until their deadline, written in
    order. Its own bound: a bound shared by both directions deadlocks against a peer that
    stops reading while its replies are not read (an echo, a server streaming results)."""

    def __init__(self, proxy: DelayProxy, src: asyncio.StreamReader, dst: asyncio.StreamWriter):
        self.proxy = proxy
        self.src = src
        self.dst = dst
        self.buffered = 0
        self.room = asyncio.Event()
        self.room.set()
        self.queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        p = self.proxy
        while True:
            while self.buffered >= p.buffered_bytes_max:
                self.room.clear()  # the sender sees TCP back-pressure, as behind a slow link
                await self.room.wait()
            data = await self.src.read(READ_CHUNK_BYTES)
            deadline = loop.time() + p._delay_s
            if not data:
                self.queue.put_nowait((deadline, None))
                return
            self.buffered += len(data)
            p._buffered += len(data)
            self.queue.put_nowait((deadline, data))

    async def write(self) -> None:
        loop = asyncio.get_running_loop()
        p = self.proxy
        while True:
            deadline, data = await self.queue.get()
            wait_s = deadline - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            await p._flowing.wait()
            # No await between the blackhole check and the write: once `blackhole(True)` has
            # returned, no further chunk is handed to the kernel.
            if data is None:
                if self.dst.can_write_eof():
                    self.dst.write_eof()  # half-close, in order after every chunk before it
                return
            self.dst.write(data)
            await self.dst.drain()
            self.buffered -= len(data)
            p._buffered -= len(data)
            p._forwarded += len(data)
            if self.buffered < p.buffered_bytes_max:
                self.room.set()


class _Conn:
    """One client connection and its connection to the target: two pipes."""

    def __init__(
        self, proxy: DelayProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.proxy = proxy
        self.client = (reader, writer)
        self.writers: list[asyncio.StreamWriter] = [writer]
        self.pipes: list[_Pipe] = []
        self.task: asyncio.Task[None] | None = None  # the task that runs `run`

    @property
    def buffered(self) -> int:
        return sum(pipe.buffered for pipe in self.pipes)

    def _abort(self) -> None:
        for w in self.writers:
            _reset(w)

    def reset(self) -> None:
        """From outside `run`: reset both sides and end it (even while it waits on a blackhole)."""
        self._abort()
        if self.task is not None:
            self.task.cancel()

    async def run(self) -> None:
        p = self.proxy
        c_reader, c_writer = self.client
        try:
            # In a partition the target never sees a SYN: connect once the link is back.
            await p._flowing.wait()
            u_reader, u_writer = await asyncio.wait_for(
                asyncio.open_connection(*p.target), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            self._abort()  # the target is down: the client sees its connection reset
            return
        self.writers.append(u_writer)
        self.pipes = [_Pipe(p, c_reader, u_writer), _Pipe(p, u_reader, c_writer)]
        tasks = [asyncio.create_task(f()) for pipe in self.pipes for f in (pipe.read, pipe.write)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(not t.cancelled() and t.exception() is not None for t in done):
                self._abort()  # one side failed: the other hears it as a reset, not a hang
            else:
                for w in self.writers:
                    w.close()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _host_port(target: tuple[str, int] | str) -> tuple[str, int]:
    """(host, port) from itself or from "host:port" (`ratemesh.checks.address_parts`)."""
    if not isinstance(target, str):
        return target
    try:
        return address_parts("target", target)
    except ConfigError as exc:
        raise ProxyError(f"DelayProxy: {exc}") from exc


class DelayProxy:
    """Listens on `listen` (port 0: any free port), forwards each connection to `target`
    ((host, port), or "host:port" as a member's address is written).

    Use as a context manager, or `start()` and `close()`. `address` is "host:port" to give a
    client (a DSN's host and port, a gRPC target).
    """

    def __init__(
        self,
        target: tuple[str, int] | str,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        *,
        connections_max: int = CONNECTIONS_MAX,
        buffered_bytes_max: int = BUFFERED_BYTES_MAX,
    ) -> None:
        if connections_max < 1:
            raise ProxyError(f"connections_max must be >= 1, got {connections_max}")
        if buffered_bytes_max < 1:
            raise ProxyError(f"buffered_bytes_max must be >= 1, got {buffered_bytes_max}")
        self.target = _host_port(target)
        self.listen = listen
        self.connections_max = connections_max
        self.buffered_bytes_max = buffered_bytes_max
        self._delay_s = 0.0
        self._blackholed = False
        self._refusing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event  # made on the proxy's loop
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepted = 0
        self._refused = 0
        self._forwarded = 0
        self._buffered = 0
        self._host = ""
        self._port = 0
        self._closed = False

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> DelayProxy:
        if self._loop is not None:
            raise ProxyError("DelayProxy.start: already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever,
            name=f"DelayProxy->{self.target[0]}:{self.target[1]}",
            daemon=True,
        )
        self._thread.start()
        try:
            self._call(self._start_server())
        except OSError as exc:
            self.close()
            raise ProxyError(f"DelayProxy: cannot listen on {self.listen}: {exc}") from exc
        return self

    async def _start_server(self) -> None:
        self._flowing = asyncio.Event()
        if not self._blackholed:
            self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1])
        sockname = self._server.sockets[0].getsockname()
        self._host, self._port = sockname[0], sockname[1]

    def close(self) -> None:
        """Stop listening, reset every connection, stop the loop. Safe to call twice."""
        if self._closed or self._loop is None or self._thread is None:
            self._closed = True
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        try:
            if loop.is_running():
                self._call(self._shutdown(), closing=True)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CONTROL_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.reset()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __enter__(self) -> DelayProxy:
        return self.start() if self._loop is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults ----------------------------------------------------------------------------

    def set_delay_ms(self, ms: float) -> None:
        """Hold each chunk read from now on `ms` before forwarding it (each direction, in
        order). A chunk already held keeps the deadline it was read with."""
        if not 0 <= ms <= DELAY_MS_MAX:
            raise ProxyError(f"set_delay_ms: {ms} is outside 0..{DELAY_MS_MAX} ms")

        async def apply() -> None:
            self._delay_s = ms / 1000.0

        self._call(apply())

    def blackhole(self, on: bool) -> None:
        """Stop (True) or resume (False) forwarding in both directions. Nothing is closed:
        held data waits (up to `buffered_bytes_max` per connection and direction, then the
        senders see TCP back-pressure) and flows in order on resume, as TCP retransmits after
        a partition heals; a new connection is accepted but reaches the target only on resume."""

        async def apply() -> None:
            self._blackholed = on
            if on:
                self._flowing.clear()
            else:
                self._flowing.set()

        self._call(apply())

    def cut(self) -> int:
        """Reset every open connection now (TCP RST both ways); how many there were. New
        connections are accepted."""

        async def apply() -> int:
            conns = list(self._conns)
            for c in conns:
                c.reset()
            return len(conns)

        return self._call(apply())

    def refuse(self, on: bool) -> None:
        """Reset (True) each new connection as soon as it is accepted, counted in
        `connections_refused`, as a host that answers with RST; or accept them again (False).
        Open connections are left as they are (`partition` cuts them too)."""

        async def apply() -> None:
            self._refusing = on

        self._call(apply())

    def partition(self) -> int:
        """A loud partition: refuse new connections and cut the open ones (how many)."""
        self.refuse(True)
        return self.cut()

    def heal(self) -> None:
        """Undo every fault: no delay, no blackhole, new connections accepted."""
        self.refuse(False)
        self.blackhole(False)
        self.set_delay_ms(0)

    # -- reading ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """ "host:port" the proxy listens on (IPv6 in brackets)."""
        if not self._port:
            raise ProxyError("DelayProxy.address: not started")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self._port}"

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        self.address  # noqa: B018 - raises when not started
        return self._port

    def stats(self) -> ProxyStats:
        async def read() -> ProxyStats:
            return ProxyStats(
                connections_open=len(self._conns),
                connections_accepted=self._accepted,
                connections_refused=self._refused,
                bytes_forwarded=self._forwarded,
                bytes_buffered=self._buffered,
            )

        return self._call(read())

    # -- the loop's side -------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], *, closing: bool = False) -> T:
        loop = self._loop
        if loop is None or (self._closed and not closing):
            coro.close()
            raise ProxyError("DelayProxy: not running (start it, or it was closed)")
        if self._thread is threading.current_thread():
            coro.close()
            raise ProxyError("DelayProxy: control calls come from outside the proxy's loop")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(CONTROL_TIMEOUT_S)
        except concurrent.futures.TimeoutError as exc:
            raise ProxyError(
                f"DelayProxy: its loop did not answer in {CONTROL_TIMEOUT_S} s"
            ) from exc

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing or len(self._conns) >= self.connections_max:
            self._refused += 1
            _reset(writer)
            return
        self._accepted += 1
        conn = _Conn(self, reader, writer)
        conn.task = asyncio.create_task(conn.run())
        self._conns.add(conn)
        self._tasks.add(conn.task)
        try:
            await asyncio.gather(conn.task, return_exceptions=True)
        finally:
            self._buffered -= conn.buffered
            self._conns.discard(conn)
            self._tasks.discard(conn.task)
