"""A fault-injecting TCP proxy for benchmarks and tests (the kernel here has no netem):
delay, dropped connections and partitions between two processes, on the running asyncio
loop."""

from __future__ import annotations

import asyncio
import contextlib

from ratemesh.checks import address_parts

__all__ = ["FaultProxy"]


class FaultProxy:
    def __init__(self, target: str) -> None:
        self.target_host, self.target_port = address_parts("target", target)
        self.delay_s = 0.0
        self.partitioned = False
        self.addr = ""
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.addr = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.addr

    def drop(self) -> int:
        """Cut every open connection (new ones are accepted); how many there were."""
        n = len(self._conns)
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()
        return n

    def partition(self) -> None:
        self.partitioned = True
        self.drop()

    def heal(self) -> None:
        self.partitioned = False
        self.delay_s = 0.0

    async def stop(self) -> None:
        self.drop()
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.partitioned:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._conns.update((writer, up_w))
        for src, dst in ((reader, up_w), (up_r, writer)):
            t = asyncio.get_running_loop().create_task(self._pipe(src, dst))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data or self.partitioned:
                    break
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(dst)
            dst.transport.abort()
