"""The one table of store schemes: how a ``store:`` setting names a database, and how to open it.

The daemon, the configuration, the CLI and the benchmarks all go through it, so a scheme is added
(or refused) in one place. A setting is ``sqlite:PATH``, a PostgreSQL URL or key=value DSN (kept
whole: it is what psycopg connects with), or ``memory:`` (not durable: benchmarks and tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ratemesh.errors import ConfigError

from ._backend import Backend
from ._memory import MemoryBackend
from ._postgres import PostgresBackend
from ._sqlite import SqliteBackend

__all__ = ["SCHEMES", "STORE_FORMS", "StoreScheme", "open_backend", "parse_store"]

# the operator's words for what a setting may be (errors and --help say it the same way)
STORE_FORMS = "sqlite:PATH or postgresql://..."

# (target, schema, application name) -> a backend, not yet migrated
Opener = Callable[[str, str, str], Backend]


@dataclass(frozen=True, slots=True)
class StoreScheme:
    """One kind of store: the prefixes that name it and what it can do."""

    name: str
    prefixes: tuple[str, ...]
    open: Opener
    durable: bool  # every acknowledged event survives a crash
    shared: bool  # several governords share it, one leading (docs/failover.md)
    whole: bool = False  # the whole setting is the target (a DSN), not what follows the prefix
    targeted: bool = True  # a target follows the prefix (``memory:`` takes none)
    shown: str | None = None  # what a log line shows instead of the target (a DSN's password)

    def describe(self, target: str) -> str:
        """The target as a log line may show it."""
        return target if self.shown is None else self.shown


SCHEMES: Mapping[str, StoreScheme] = MappingProxyType(
    {
        "sqlite": StoreScheme(
            "sqlite",
            ("sqlite:",),
            lambda target, schema, app: SqliteBackend(target),
            durable=True,
            shared=False,
        ),
        "postgres": StoreScheme(
            "postgres",
            ("postgresql://", "postgres://", "host="),
            lambda target, schema, app: PostgresBackend(
                target, schema=schema, application_name=app
            ),
            durable=True,
            shared=True,
            whole=True,
            shown="postgresql",
        ),
        "memory": StoreScheme(
            "memory",
            ("memory:",),
            lambda target, schema, app: MemoryBackend(),
            durable=False,
            shared=False,
            targeted=False,
            shown="(not durable)",
        ),
    }
)


def parse_store(setting: str) -> tuple[StoreScheme, str]:
    """The scheme a ``store:`` setting names and its target (a path, a DSN, or "")."""
    for scheme in SCHEMES.values():
        prefix = next((p for p in scheme.prefixes if setting.startswith(p)), None)
        if prefix is None:
            continue
        target = setting if scheme.whole else setting[len(prefix) :]
        if scheme.targeted or not target:
            return scheme, target
    raise ConfigError("store", f"must be {STORE_FORMS}, got {setting!r}")


def open_backend(
    kind: str, target: str, *, schema: str = "governor", application_name: str = "governord"
) -> Backend:
    """A backend of scheme ``kind`` (a name in ``SCHEMES``) on ``target``, not yet migrated."""
    scheme = SCHEMES.get(kind)
    if scheme is None:
        # The kind comes from the operator's `store:` setting, so the mistake is theirs to fix.
        names = ", ".join(repr(k) for k in SCHEMES)
        raise ConfigError("store", f"kind must be one of {names}, got {kind!r}")
    return scheme.open(target, schema, application_name)
