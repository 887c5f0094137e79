"""Errors the SDK raises, translated from gRPC status and governord's detail at the adapter::

GovernorClientError
├── Denied                  a cap, limit or queue said no; ``denial`` names node and top consumer
│   └── NodeEnded           the task (or an ancestor) has ended: done, cancelled or past deadline
├── LeaseEnded              a release came too late: the lease ended otherwise (``end``)
├── SessionLost             the session ended or its local deadline passed; work was cancelled
├── AuthError               unknown API key or token (UNAUTHENTICATED)
├── ScopeError              the call is outside this tenant's subtree (PERMISSION_DENIED)
├── RequestError            a malformed call or argument (INVALID_ARGUMENT, NOT_FOUND, ...)
├── AcquireTimeout          no lease within the timeout
└── Unavailable             governord could not be reached before giving up
    └── LeaderChanged       a waiting acquire was cut by a leader change (not resent: retry)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AcquireTimeout",
    "AuthError",
    "Denied",
    "GovernorClientError",
    "LeaderChanged",
    "LeaseEnded",
    "NodeEnded",
    "RequestError",
    "ScopeError",
    "SessionLost",
    "Unavailable",
]


class GovernorClientError(Exception):
    """Root of the SDK's errors. ``code`` is the gRPC status name, ``detail`` governord's map."""

    def __init__(self, message: str, code: str = "", detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.detail = detail or {}


class Denied(GovernorClientError):
    @property
    def denial(self) -> dict[str, Any]:
        d = self.detail.get("denial")
        return d if isinstance(d, dict) else {}


class NodeEnded(Denied):
    pass


class LeaseEnded(GovernorClientError):
    @property
    def end(self) -> str:
        return str(self.detail.get("end", ""))


class SessionLost(GovernorClientError):
    pass


class AuthError(GovernorClientError):
    pass


class ScopeError(GovernorClientError):
    pass


class RequestError(GovernorClientError):
    pass


class AcquireTimeout(GovernorClientError):
    pass


class Unavailable(GovernorClientError):
    pass


class LeaderChanged(Unavailable):
    """A waiting ``Acquire`` lost its governord (deposed, or gone) while it waited. Its wait
    lived in that process's fair queue, so it is not resent behind the caller's back: the
    caller retries (or not) knowing it waited and has no lease."""
