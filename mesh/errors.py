"""The mesh's error tree.

Two kinds of failure are kept apart (the h11 habit): a caller's or config's mistake, which
is ours to report clearly, and a peer's malformed message. A denial is never an exception:
it is a `Verdict` value.

    MeshError
    ├── ConfigError (ValueError)          bad argument, policy or config; names the field
    │   └── ConfigTypeError (TypeError)   the field has the wrong type
    ├── MessageError (ValueError)         a peer's message failed validation; names the field
    │   └── MessageTypeError (TypeError)
    └── PeerError                         a peer (or membership/coordinator service) failed
        ├── PeerUnavailable               unreachable, timed out, or gone (retry later)
        └── PeerRefused                   it answered with an error status (our request)

Every error carries `.field`, the dotted name of what was wrong, and raising one changes
no state: validation happens before anything is mutated.
"""

from __future__ import annotations

__all__ = [
    "MeshError",
    "ConfigError",
    "ConfigTypeError",
    "MessageError",
    "MessageTypeError",
    "PeerError",
    "PeerUnavailable",
    "PeerRefused",
]


class MeshError(Exception):
    """Base of every error ratemesh's mesh raises on purpose."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ConfigError(MeshError, ValueError):
    """A caller's or configuration's value is out of range or unknown."""


class ConfigTypeError(ConfigError, TypeError):
    """A caller's or configuration's value has the wrong type."""


class MessageError(MeshError, ValueError):
    """A message from a peer is malformed; it is refused and changes nothing."""


class MessageTypeError(MessageError, TypeError):
    """A message field from a peer has the wrong type."""


class PeerError(MeshError):
    """A remote party failed us; translated from grpc/httpx errors at the adapter."""


class PeerUnavailable(PeerError):
    """The remote party could not be reached, timed out, or went away."""


class PeerRefused(PeerError):
    """The remote party answered with an error status; `field` names the call."""
