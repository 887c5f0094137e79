"""The `shared_state:` section of a node's config: consent to dial a network Redis.

    shared_state:
      redis:
        external: allow              # the literal consent string; without it nothing dials
        addr: "10.0.0.10:6379"
        password_env: RATEMESH_REDIS_PASSWORD   # the variable's name, never the secret
        tls: true                    # verified against the system's trust store

    shared_state:
      postgres:
        external: allow              # the same consent string
        dsn_env: RATEMESH_PG_DSN     # the variable's name; the DSN (and its password) stays there
        schema: ratemesh             # optional: the schema that holds the cells' table

`shared_state.postgres` holds the spend quotas' cells only (docs/postgres.md); redis-mode
limits need a Redis. One cell tier per node: naming both is a ConfigError.

With no `shared_state.redis` the node opens no coordination connection at all, and a
redis-mode policy is enforced by each process alone, suspended `redis_unreachable`
(docs/redis.md). An address without `external: allow` is a ConfigError naming the field,
not a quiet skip. Four keys and no more: the deadline (5 ms) and the breaker (5 failures,
5 s probe) are not config. Loading reads the password's variable and dials nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from mesh.core._validate import check_bool, check_str
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.checks import address_parts, check_address, check_keys, is_loopback

__all__ = ["CONSENT", "PostgresConfig", "RedisConfig", "SharedStateConfig", "parse_shared_state"]

CONSENT = "allow"  # shared_state.redis.external: the one value that lets the node dial
_KEYS = {"external", "addr", "password_env", "tls"}
_PG_KEYS = {"external", "dsn_env", "schema"}
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # a plain SQL identifier: no quoting needed


@dataclass(frozen=True, slots=True)
class RedisConfig:
    addr: str  # host:port
    password: str | None = field(default=None, repr=False)  # read from $password_env
    password_env: str | None = None
    tls: bool = False

    @property
    def host(self) -> str:
        """The host to dial (an IPv6 address without its brackets)."""
        return address_parts("shared_state.redis.addr", self.addr, error=ConfigError)[0]

    @property
    def port(self) -> int:
        return address_parts("shared_state.redis.addr", self.addr, error=ConfigError)[1]

    def warnings(self) -> list[str]:
        """What consent gives up (seed 002: printed at every `mesh validate`)."""
        out = [
            f'shared_state.redis: a network redis at "{self.addr}" is enabled — the '
            "process-local posture is broken for the coordination tier: redis-mode limits "
            "take one round trip per admission, and while it does not answer each process "
            "enforces the whole limit alone (fleet <= N x limit, suspended "
            "redis_unreachable; docs/redis.md)"
        ]
        if not self.tls and not is_loopback(self.addr):
            out.append(
                f'shared_state.redis.tls: false for "{self.addr}": admissions and the '
                "password cross the network in plaintext"
            )
        return out


@dataclass(frozen=True, slots=True)
class PostgresConfig:
    dsn: str = field(repr=False)  # read from $dsn_env: it may carry a password
    dsn_env: str
    schema: str = "ratemesh"

    def warnings(self) -> list[str]:
        """What consent gives up, as for Redis (printed at every `mesh validate`)."""
        return [
            f"shared_state.postgres: a network PostgreSQL (${self.dsn_env}, schema "
            f'"{self.schema}") is enabled — the process-local posture is broken for the '
            "spend quotas' cell tier: each quota key's cells cross the network once a "
            "second, off the admission path (docs/postgres.md)"
        ]


@dataclass(frozen=True, slots=True)
class SharedStateConfig:
    redis: RedisConfig | None = None  # None: nothing dials; redis limits run alone
    postgres: PostgresConfig | None = None  # None: no spend-quota cells in PostgreSQL


def parse_shared_state(data: Any) -> SharedStateConfig:
    """Validate the section; every mistake is a ConfigError naming `shared_state.<key>`."""
    if not isinstance(data, dict):
        raise ConfigTypeError("shared_state", f"must be a mapping, got {type(data).__name__}")
    check_keys("shared_state", data, {"redis", "postgres"}, error=ConfigError)
    redis = None if data.get("redis") is None else _redis(data["redis"])
    postgres = None if data.get("postgres") is None else _postgres(data["postgres"])
    if redis is not None and postgres is not None:
        raise ConfigError(
            "shared_state.postgres",
            "name one shared-state tier, redis or postgres, not both (each would hold "
            "the spend quotas' cells)",
        )
    return SharedStateConfig(redis, postgres)


def _consent(where: str, data: dict[str, Any], what: str) -> None:
    if data.get("external") != CONSENT:
        got = "missing" if "external" not in data else f"got {data['external']!r}"
        raise ConfigError(
            f"{where}.external",
            f'must be "{CONSENT}" to dial {what} ({got}); without the consent string nothing dials',
        )


def _postgres(data: Any) -> PostgresConfig:
    where = "shared_state.postgres"
    if not isinstance(data, dict):
        raise ConfigTypeError(where, f"must be a mapping, got {type(data).__name__}")
    check_keys(where, data, _PG_KEYS, error=ConfigError)
    if data.get("dsn_env") is None:
        raise ConfigError(
            f"{where}.dsn_env", "is required (the name of the variable that holds the DSN)"
        )
    env = check_str(f"{where}.dsn_env", data["dsn_env"], max_len=256)
    _consent(where, data, f"the network PostgreSQL whose DSN is in ${env}")
    dsn = os.environ.get(env)
    if not dsn:
        raise ConfigError(f"{where}.dsn_env", f"${env} is not set (it should hold the DSN)")
    schema = check_str(f"{where}.schema", data.get("schema", "ratemesh"))
    if not _SCHEMA.fullmatch(schema):
        raise ConfigError(
            f"{where}.schema",
            f"{schema!r} must be a lowercase SQL identifier (letters, digits, '_'; at most 63)",
        )
    return PostgresConfig(dsn, env, schema)


def _redis(data: Any) -> RedisConfig:
    where = "shared_state.redis"
    if not isinstance(data, dict):
        raise ConfigTypeError(where, f"must be a mapping, got {type(data).__name__}")
    check_keys(where, data, _KEYS, error=ConfigError)
    if data.get("addr") is None:
        raise ConfigError(f"{where}.addr", 'is required (host:port, e.g. "10.0.0.10:6379")')
    addr = check_str(f"{where}.addr", data["addr"])
    check_address(f"{where}.addr", addr, error=ConfigError)
    _consent(where, data, f"the network redis at {addr}")
    password, env = None, data.get("password_env")
    if env is not None:
        env = check_str(f"{where}.password_env", env, max_len=256)
        password = os.environ.get(env)
        if password is None:
            raise ConfigError(
                f"{where}.password_env", f"${env} is not set (it should hold redis's password)"
            )
    tls = check_bool(f"{where}.tls", data.get("tls", False))
    return RedisConfig(addr, password, env, tls)
