"""A thin sync wrapper: the async Client runs on a private event loop thread; each method
submits a coroutine there and waits. The current task travels in a contextvar of the calling
thread, as with the async client."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from ._client import Client, Lease
from ._errors import GovernorClientError

__all__ = ["SyncClient", "SyncTask", "current_sync_task"]

T = TypeVar("T")
# At close, how long tasks left on the private loop (grpc's per-call status tasks) get to
# end before they are cancelled.
CLOSE_DRAIN_S = 1.0


@dataclass(slots=True)
class SyncTask:
    client: SyncClient
    node_id: int
    name: str


_SYNC_CURRENT: contextvars.ContextVar[SyncTask | None] = contextvars.ContextVar(
    "governor_sync_task", default=None
)


def current_sync_task() -> SyncTask:
    task = _SYNC_CURRENT.get()
    if task is None:
        raise GovernorClientError("no governed task here: use `with client.task(...)`")
    return task


class SyncClient:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="governor-client", daemon=True
        )
        self._thread.start()

        async def make() -> Client:
            return await Client(*args, **kwargs).connect()

        try:
            self.aio = self._run(make())
        except BaseException:
            self._run(_drain())  # a failed connect leaves grpc's tasks too
            self._loop.call_soon_threadsafe(self._loop.stop)  # no thread left behind
            self._thread.join()
            self._loop.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _shutdown(self) -> None:
        """Close the client, then finish what is left on the private loop before it closes:
        grpc leaves a task per call that sees the call's status after the call returned,
        and a loop closed under it prints "Task was destroyed but it is pending!" (seen at
        the end of `gov run`). Such tasks get CLOSE_DRAIN_S to end, then are cancelled."""
        await self.aio.close()
        await _drain()

    def _here(self, node_id: int | None) -> int:
        if node_id is not None:
            return node_id
        task = _SYNC_CURRENT.get()
        return task.node_id if task is not None and task.client is self else self.aio.scope_id

    @contextmanager
    def task(
        self,
        name: str,
        *,
        quotas: dict[str, int] | None = None,
        limits: dict[str, int] | None = None,
        deadline: float | None = None,
    ) -> Iterator[SyncTask]:
        node_id = self._run(
            self.aio.create_node(
                name, parent_id=self._here(None), quotas=quotas, limits=limits, deadline=deadline
            )
        )
        task = SyncTask(self, node_id, name)
        token = _SYNC_CURRENT.set(task)
        ok = False
        try:
            yield task
            ok = True
        finally:
            _SYNC_CURRENT.reset(token)
            if self.aio.lost is None:
                try:
                    self._run(self.aio.end_node(node_id, cancel=not ok))
                except GovernorClientError:
                    pass

    def consume(self, resource: str, amount: int = 1, *, node_id: int | None = None) -> None:
        self._run(self.aio.consume_at(self._here(node_id), resource, amount))

    @contextmanager
    def acquire(
        self, cls: str, *, node_id: int | None = None, timeout: float | None = None
    ) -> Iterator[Lease]:
        lease = self._run(self.aio.acquire_at(self._here(node_id), cls, timeout))
        try:
            yield lease
        finally:
            if self.aio.lost is None:
                self._run(self.aio.release(lease))

    def validate(self, lease_id: int) -> bool:
        return self._run(self.aio.validate(lease_id))

    def get_node(self, node_id: int | None = None) -> dict[str, Any]:
        return self._run(self.aio.get_node(node_id))


async def _drain() -> None:
    """Let the loop's other tasks end within CLOSE_DRAIN_S, cancel the rest, await them."""
    me = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not me]
    if rest:
        _, pending = await asyncio.wait(rest, timeout=CLOSE_DRAIN_S)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
