"""httpx transports that govern every request: one ``http`` unit is charged and one ``http``
lease is held per request (until the response headers arrive); a 429 or 503 is reported as
overloaded on release, which is what the adaptive limit listens to."""

from __future__ import annotations

import httpx

from ._client import current_task

__all__ = ["GovernedAsyncTransport", "GovernedTransport", "OVERLOAD_STATUSES"]

OVERLOAD_STATUSES = frozenset({429, 503})


class GovernedAsyncTransport(httpx.AsyncBaseTransport):
    """For ``httpx.AsyncClient(transport=GovernedAsyncTransport())`` inside a governed task."""

    def __init__(
        self,
        wrapped: httpx.AsyncBaseTransport | None = None,
        *,
        resource: str = "http",
        cls: str = "http",
    ) -> None:
        self._wrapped = wrapped or httpx.AsyncHTTPTransport()
        self.resource = resource
        self.cls = cls

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        task = current_task()
        client = task.client
        await client.consume_at(task.node_id, self.resource, 1)
        async with client.acquire(self.cls, node_id=task.node_id) as lease:
            response = await self._wrapped.handle_async_request(request)
            lease.overloaded = response.status_code in OVERLOAD_STATUSES
            return response

    async def aclose(self) -> None:
        await self._wrapped.aclose()


class GovernedTransport(httpx.BaseTransport):
    """The same for sync ``httpx.Client``, through a :class:`SyncClient` task."""

    def __init__(
        self,
        wrapped: httpx.BaseTransport | None = None,
        *,
        resource: str = "http",
        cls: str = "http",
    ) -> None:
        self._wrapped = wrapped or httpx.HTTPTransport()
        self.resource = resource
        self.cls = cls

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        from ._sync import current_sync_task

        task = current_sync_task()
        task.client.consume(self.resource, 1, node_id=task.node_id)
        with task.client.acquire(self.cls, node_id=task.node_id) as lease:
            response = self._wrapped.handle_request(request)
            lease.overloaded = response.status_code in OVERLOAD_STATUSES
            return response

    def close(self) -> None:
        self._wrapped.close()
