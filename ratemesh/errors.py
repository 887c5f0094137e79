"""The configuration-error family that the mesh, governord and the simulator share.

    RatemeshError                        carries .field (dotted name) and .problem
    ├── ConfigError (ValueError)         an operator's or caller's value is wrong
    │   └── ConfigTypeError (TypeError)  ... because it has the wrong type
    └── MessageError (ValueError)        a peer's message (the coordinator wire) is malformed
        └── MessageTypeError (TypeError)

`mesh.errors.ConfigError` and `governor.config.ConfigError` derive from `ConfigError`, so
every command catches this one class at its boundary and prints `str(exc)` as one line.
`mesh.errors.MessageError` derives from `MessageError` the same way, so the shared wire shapes
(`ratemesh.coordinator`) can refuse a peer's message in the family their caller names.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["RatemeshError", "ConfigError", "ConfigTypeError", "MessageError", "MessageTypeError"]


class RatemeshError(Exception):
    """Base of every error ratemesh raises on purpose; `field` names what was wrong."""

    # The class a type mismatch in this family raises (set below for each family).
    type_error: ClassVar[type[RatemeshError]]

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ConfigError(RatemeshError, ValueError):
    """An operator's or caller's value is out of range, unknown, or unreadable."""


class ConfigTypeError(ConfigError, TypeError):
    """An operator's or caller's value has the wrong type."""


class MessageError(RatemeshError, ValueError):
    """A message from a peer is malformed; it is refused and changes nothing."""


class MessageTypeError(MessageError, TypeError):
    """A message field from a peer has the wrong type."""


RatemeshError.type_error = ConfigTypeError
ConfigError.type_error = ConfigTypeError
MessageError.type_error = MessageTypeError
