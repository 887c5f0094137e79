"""``retry``: retries spend the ``retry`` quota of the current task (and so of its whole chain);
the first attempt is free. When the budget is spent, the last error is raised at once. A
governor error from ``fn`` (a denial, a lost session) is never retried."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ._client import current_task
from ._errors import Denied, GovernorClientError

__all__ = ["retry"]

T = TypeVar("T")


async def retry(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int | None = None,
    resource: str = "retry",
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    backoff_s: float = 0.0,
) -> T:
    """Call ``fn`` until it succeeds, ``attempts`` run out, or the retry budget says no."""
    task = current_task()
    n = 0
    while True:
        n += 1
        try:
            return await fn()
        except GovernorClientError:
            raise
        except retry_on as exc:
            if attempts is not None and n >= attempts:
                raise
            try:
                await task.client.consume_at(task.node_id, resource, 1)
            except Denied:
                raise exc from None
            if backoff_s:
                await asyncio.sleep(backoff_s * (2 ** (n - 1)))
