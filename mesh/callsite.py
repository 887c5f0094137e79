"""Call-site helpers: a decorator and a context manager over `Mesh`'s admission.

    with mesh.limited("acme", "client_egress_bytes", len(chunk)) as charge:
        sent = sock.send(chunk)
        charge.used(sent)                      # a short send: the rest goes back

    async with mesh.limited("acme", "tokens", 4096, timeout_s=0.5) as charge:
        reply = await model.complete(prompt)
        charge.used(reply.tokens)

    @mesh.limited("acme", "requests")
    async def handler(request): ...

On enter it admits `amount`: `try_admit` (no wait) by default; with `timeout_s`, a bounded
wait in the tenant's queue (`admit_blocking` for `with`, `await admit` for `async with`).
Denied, it raises `RateLimited`, carrying the `Verdict`: the caller asked for an exception
by using the helper (`try_admit` itself still returns the denial as a value).

On exit it refunds what the block said it did not use: `charge.used(n)` (n of the charge
were used) or `charge.refund(n)` (give n back now). Saying neither means all was used. An
exception inside the block refunds nothing by default, since the work may have happened
and counting it errs on the safe side; `refund_on_error=True` refunds what is left of the
charge (for calls that fail before anything was sent). The exception always propagates.

A `Limited` is one admission's description; each `with`/`async with` (and each call of a
decorated function) takes its own charge, kept in a context variable, so one object serves
any number of concurrent threads and tasks. The descriptor form
(`descriptor=("route", "/upload")`) narrows the tenant as a policy's descriptor does
(`ratemesh.policy.descriptor_tenant`, docs/policies.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar, cast

from mesh.core.verdict import Verdict
from mesh.errors import ConfigError, RateLimited
from ratemesh.errors import RatemeshError
from ratemesh.policy import check_metric, descriptor_tenant

__all__ = ["Admits", "Charge", "Limited", "limited"]

F = TypeVar("F", bound=Callable[..., Any])


class Admits(Protocol):
    """What the helpers need of a `Mesh` (and what a test's stand-in must provide)."""

    def try_admit(self, tenant: str, metric: str, amount: int = 1) -> Verdict: ...

    def refund(self, tenant: str, metric: str, amount: int) -> None: ...

    async def admit(
        self, tenant: str, metric: str, amount: int = 1, *, timeout_s: float
    ) -> Verdict: ...

    def admit_blocking(
        self, tenant: str, metric: str, amount: int = 1, *, timeout_s: float
    ) -> Verdict: ...


class Charge:
    """One admitted charge inside a `with` block: say how much of it was used."""

    __slots__ = ("tenant", "metric", "charged", "verdict", "_mesh", "_back", "_used", "_open")

    def __init__(self, mesh: Admits, tenant: str, metric: str, charged: int, v: Verdict) -> None:
        self._mesh = mesh
        self.tenant = tenant  # the RateKey's tenant part (a descriptor folded in)
        self.metric = metric
        self.charged = charged
        self.verdict = v
        self._back = 0  # refunded so far
        self._used: int | None = None  # None: not said (all of it counts as used)
        self._open = True

    @property
    def refunded(self) -> int:
        return self._back

    def used(self, n: int) -> None:
        """`n` of the charge were used; the rest is refunded when the block ends."""
        self._check(n, "used")
        if n > self.charged - self._back:
            raise ConfigError(
                "used", f"{n} is more than the {self.charged - self._back} left of the charge"
            )
        self._used = n

    def refund(self, n: int) -> None:
        """Give `n` of the charge back now (a short send known before the block ends)."""
        self._check(n, "refund")
        left = self.charged - self._back - (self._used or 0)
        if n > left:
            raise ConfigError("refund", f"{n} is more than the {left} left of the charge")
        if n:
            self._mesh.refund(self.tenant, self.metric, n)
            self._back += n

    def _close(self, failed: bool, refund_on_error: bool) -> None:
        if not self._open:
            return
        self._open = False
        if failed:
            if refund_on_error:
                rest = self.charged - self._back
                if rest:
                    self._mesh.refund(self.tenant, self.metric, rest)
                    self._back += rest
            return
        if self._used is not None:
            rest = self.charged - self._back - self._used
            if rest:
                self._mesh.refund(self.tenant, self.metric, rest)
                self._back += rest

    def _check(self, n: int, what: str) -> None:
        if not self._open:
            raise ConfigError(what, "the charge's block has ended")
        if type(n) is not int or n < 0:
            raise ConfigError(what, f"must be an integer >= 0, got {n!r}")

    def __repr__(self) -> str:
        return (
            f"Charge({self.tenant!r}, {self.metric!r}, charged={self.charged}, "
            f"refunded={self._back})"
        )


class Limited:
    """A context manager (sync and async) and a decorator that admits one charge."""

    __slots__ = ("_mesh", "tenant", "metric", "amount", "timeout_s", "refund_on_error")

    def __init__(
        self,
        mesh: Admits,
        tenant: str,
        metric: str,
        amount: int = 1,
        *,
        descriptor: Any = None,
        timeout_s: float | None = None,
        refund_on_error: bool = False,
    ) -> None:
        if type(tenant) is not str or not tenant:
            raise ConfigError("tenant", f"must be a non-empty string, got {tenant!r}")
        self._mesh = mesh
        try:
            self.tenant = tenant if descriptor is None else descriptor_tenant(tenant, descriptor)
        except RatemeshError as exc:  # the shared model's family, re-homed in the mesh's
            raise ConfigError(exc.field, exc.problem) from exc
        self.metric = check_metric(metric, error=ConfigError)
        if type(amount) is not int or amount <= 0:
            raise ConfigError("amount", f"must be an integer > 0, got {amount!r}")
        self.amount = amount
        if timeout_s is not None and (
            not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s < 0
        ):
            raise ConfigError("timeout_s", f"must be a number >= 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.refund_on_error = refund_on_error

    # -- sync ------------------------------------------------------------------------------

    def __enter__(self) -> Charge:
        if self.timeout_s is None:
            v = self._mesh.try_admit(self.tenant, self.metric, self.amount)
        else:
            v = self._mesh.admit_blocking(
                self.tenant, self.metric, self.amount, timeout_s=self.timeout_s
            )
        return self._charge(v)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._pop()._close(exc_type is not None, self.refund_on_error)

    # -- async -----------------------------------------------------------------------------

    async def __aenter__(self) -> Charge:
        if self.timeout_s is None:
            v = self._mesh.try_admit(self.tenant, self.metric, self.amount)
        else:
            v = await self._mesh.admit(
                self.tenant, self.metric, self.amount, timeout_s=self.timeout_s
            )
        return self._charge(v)

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._pop()._close(exc_type is not None, self.refund_on_error)

    # -- decorator -------------------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Admit once per call of `fn` (a function or a coroutine function)."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with self:
                    return await cast(Callable[..., Awaitable[Any]], fn)(*args, **kwargs)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return cast(F, run)

    def _charge(self, v: Verdict) -> Charge:
        if not v.allowed:
            raise RateLimited(v, self.tenant, self.metric, self.amount)
        charge = Charge(self._mesh, self.tenant, self.metric, self.amount, v)
        _CHARGES.set((*_CHARGES.get(), (self, charge)))
        return charge

    def _pop(self) -> Charge:
        """This object's innermost charge in the current thread or task."""
        live = _CHARGES.get()
        for i in range(len(live) - 1, -1, -1):
            if live[i][0] is self:
                _CHARGES.set(live[:i] + live[i + 1 :])
                return live[i][1]
        raise ConfigError("limited", "exited without being entered in this thread or task")

    def __repr__(self) -> str:
        return f"Limited({self.tenant!r}, {self.metric!r}, {self.amount})"


# The charges entered and not yet exited, innermost last: per thread and per asyncio task
# (each has its own context), so concurrent blocks on one `Limited` never swap charges.
_CHARGES: ContextVar[tuple[tuple[Limited, Charge], ...]] = ContextVar("mesh_charges", default=())


# `mesh.limited(admitter, ...)`, for any admitter (module docstring): the class itself, so
# its signature is written once.
limited = Limited
