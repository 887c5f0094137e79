"""The mesh's error tree.

Two kinds of failure are kept apart (the h11 habit): a caller's or config's mistake, which
is ours to report clearly, and a peer's malformed message. A denial is never an exception:
it is a `Verdict` value.

    ratemesh.errors.RatemeshError           (shared with governord and the simulator)
    └── MeshError
        ├── ConfigError (ValueError)          bad argument, policy or config; names the field
        │   └── ConfigTypeError (TypeError)   the field has the wrong type
        ├── MessageError (ValueError)         a peer's message failed validation; names the field
        │   └── MessageTypeError (TypeError)
        ├── PeerError                         a peer (or membership/coordinator service) failed
        │   ├── PeerUnavailable               unreachable, timed out, or gone (retry later)
        │   └── PeerRefused                   it answered with an error status (our request)
        └── RateLimited                       a call-site helper's admission was denied
                                              (mesh.callsite; carries the Verdict)

`RateLimited` is the one denial that is an exception, and only because the caller chose
the call-site helpers (`Mesh.limited`), whose block cannot run without the admission;
`try_admit`, `admit` and the cores return a denial as a value.

`ConfigError`, `ConfigTypeError`, `MessageError` and `MessageTypeError` also derive from
their namesakes in `ratemesh.errors`, so one `except ratemesh.errors.ConfigError` at a
command's boundary catches every config mistake of the mesh, governord and the simulator.
Each family names the class a type mismatch raises in `type_error`, which the shared checks
in `ratemesh.checks` use.

A policy's own validation (`ratemesh.policy.TenantRatePolicy`, the model shared with
governord) raises the shared `ratemesh.errors.ConfigError`, the base of this `ConfigError`;
the mesh's loaders re-home it here through `TenantRatePolicy.from_dict(..., error=...)`.

Every error carries `.field`, the dotted name of what was wrong, and raising one changes
no state: validation happens before anything is mutated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ratemesh.errors

if TYPE_CHECKING:
    from mesh.core.verdict import Verdict

__all__ = [
    "MeshError",
    "ConfigError",
    "ConfigTypeError",
    "MessageError",
    "MessageTypeError",
    "PeerError",
    "PeerUnavailable",
    "PeerRefused",
    "RateLimited",
]


class MeshError(ratemesh.errors.RatemeshError):
    """Base of every error ratemesh's mesh raises on purpose; `.field` and `.problem`."""


class ConfigError(MeshError, ratemesh.errors.ConfigError):
    """A caller's or configuration's value is out of range or unknown."""


class ConfigTypeError(ConfigError, ratemesh.errors.ConfigTypeError):
    """A caller's or configuration's value has the wrong type."""


class MessageError(MeshError, ratemesh.errors.MessageError):
    """A message from a peer is malformed; it is refused and changes nothing."""


class MessageTypeError(MessageError, ratemesh.errors.MessageTypeError):
    """A message field from a peer has the wrong type."""


class PeerError(MeshError):
    """A remote party failed us; translated from grpc/httpx errors at the adapter."""


class PeerUnavailable(PeerError):
    """The remote party could not be reached, timed out, or went away."""


class PeerRefused(PeerError):
    """The remote party answered with an error status; `field` names the call."""


ConfigError.type_error = ConfigTypeError
MessageError.type_error = MessageTypeError


class RateLimited(MeshError):
    """A `Mesh.limited` block or decorated call was denied; `.verdict` says why."""

    def __init__(self, verdict: Verdict, tenant: str, metric: str, amount: int) -> None:
        self.verdict = verdict
        self.tenant = tenant
        self.metric = metric
        self.amount = amount
        why = verdict.reason.value
        if verdict.suspended is not None:
            why += f", suspended: {verdict.suspended.value}"
        super().__init__(
            "amount", f"{amount} {metric} for {tenant!r} denied ({why}; {verdict.bound})"
        )
