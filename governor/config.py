"""governord's configuration: YAML in, validated dataclasses out; every error names its key.

API keys are never required in clear text: a tenant names an environment variable that holds
its key (``api_key_env``) or gives the key's SHA-256 (``api_key_sha256``). A key read from the
environment must not be guessable (``ratemesh.secretcheck``: at least 16 bytes, no placeholder,
no pattern); a digest cannot be checked that way. With no file at all,
:func:`default_config` serves 127.0.0.1 with SQLite in the working directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ratemesh.errors
from governor.engine import AdaptiveConfig, Defaults, EngineConfig, Rate
from governor.store import STORE_FORMS, parse_store
from ratemesh.apikey import read_api_key
from ratemesh.checks import (
    check_address,
    check_bool,
    check_float,
    check_int,
    check_keys,
    is_loopback,
    is_wildcard,
)
from ratemesh.policy import TenantRatePolicy
from ratemesh.policyfile import load_policy_file
from ratemesh.secretcheck import weak_secret
from ratemesh.yamlfile import load_yaml

__all__ = [
    "ConfigError",
    "ConfigTypeError",
    "CoordinatorKey",
    "CoordinatorSettings",
    "GovernordConfig",
    "HaSettings",
    "TenantConfig",
    "TlsFiles",
    "config_warnings",
    "default_config",
    "is_loopback",
    "load_config",
    "parse_config",
]

DEFAULT_LISTEN = "127.0.0.1:7443"
DEFAULT_STORE = "sqlite:governor.db"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Bounds on the numbers an operator writes; the engine checks its own invariants again.
DRAIN_S_MAX = 3600.0
TTL_MS_MAX = 7 * 86_400_000
SNAPSHOT_EVERY_MAX = 1_000_000_000
NODES_PER_TENANT_MAX_MAX = 10_000_000  # the most nodes_per_tenant_max may say
# Leadership on PostgreSQL (``ha``): the takeover bound when a leader is cut off is about
# lease_ms + renew_ms + the replay; a killed leader is replaced within about renew_ms + replay.
HA_LEASE_MS = 1500
HA_RENEW_MS = 250
HA_LEASE_MS_MIN = 100
HA_LEASE_MS_MAX = 60_000
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1  # the engine's floor; a symmetric ceiling
PERMILLE_MAX = 1000
RATE_PER_S_MAX = 10**9  # as the engine's (governor.engine._credit)
BURST_MAX = 10**12


class ConfigError(ratemesh.errors.ConfigError):
    """A configuration mistake; ``field`` (also ``key``, its older name) is the dotted path
    of the value at fault. A ``ratemesh.errors.ConfigError``, which every command catches."""

    @property
    def key(self) -> str:
        return self.field


class ConfigTypeError(ConfigError, ratemesh.errors.ConfigTypeError):
    """A configuration value of the wrong type."""


ConfigError.type_error = ConfigTypeError


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str
    key: str


@dataclass(frozen=True, slots=True)
class TenantConfig:
    name: str
    key_sha256: str
    weight: int = 1
    quotas: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    defaults: Defaults | None = None
    rates: dict[str, Rate] = field(default_factory=dict)  # credit blocks (docs/strict.md)


# What a coordinator API key may do (docs/policies.md): a worker's key reads (List, Watch,
# History); a coordinator's key also writes (Put, Remove).
KEY_SCOPES = ("coordinator", "worker")
COORDINATOR_KEYS_MAX = 256


@dataclass(frozen=True, slots=True)
class CoordinatorKey:
    name: str
    key_sha256: str
    scope: str  # one of KEY_SCOPES


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    """governord as the mesh's policy coordinator: who may call it, and the policies file it
    imports once as the first generations of keys it holds nothing for (the bootstrap)."""

    keys: tuple[CoordinatorKey, ...] = ()
    policies_file: str | None = None
    bootstrap: tuple[TenantRatePolicy, ...] = ()


@dataclass(frozen=True, slots=True)
class HaSettings:
    """Leader and standbys on one PostgreSQL database (docs/failover.md). A standby takes over
    at once when the leader's process is gone, and at most ``lease_ms`` after its last renewal
    when it is cut off; it looks every ``renew_ms``, the interval the leader renews at."""

    lease_ms: int = HA_LEASE_MS
    renew_ms: int = HA_RENEW_MS
    advertise: str | None = None  # what standbys tell clients; default: the first listen address


@dataclass(frozen=True, slots=True)
class GovernordConfig:
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    store: str = DEFAULT_STORE
    tls: TlsFiles | None = None
    allow_plaintext: bool = False
    metrics: str | None = None
    session_ttl_ms: int = 10_000
    session_ttl_min_ms: int = 200
    session_ttl_max_ms: int = 3_600_000
    drain_s: float = 5.0
    snapshot_every: int = 10_000
    nodes_per_tenant_max: int = EngineConfig().nodes_per_tenant_max  # nodes one tenant holds
    root_quotas: dict[str, int] = field(default_factory=dict)
    root_limits: dict[str, int] = field(default_factory=dict)
    root_rates: dict[str, Rate] = field(default_factory=dict)
    adaptive: dict[str, AdaptiveConfig] = field(default_factory=dict)
    tenants: tuple[TenantConfig, ...] = ()
    coordinator: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    ha: HaSettings = field(default_factory=HaSettings)
    # the HTTP pages' token (``pages.token_file`` / ``pages.token_env``): per-tenant detail
    # (/ui, /ui/status, /metrics' tenant series) for a caller off loopback (docs/security.md)
    pages_tokens: tuple[bytes, ...] = field(default=(), repr=False)

    def store_kind(self) -> tuple[str, str]:
        """(``sqlite``, path), (``postgres``, dsn) or (``memory``, "") - not durable, benchmarks."""
        scheme, target = parse_store(self.store)
        return scheme.name, target


def _type(key: str, value: Any, kind: type, what: str) -> Any:
    """A map, list or string; numbers go through `_pos` (ratemesh's checks: no bools)."""
    if not isinstance(value, kind):
        raise ConfigTypeError(key, f"must be {what}, got {type(value).__name__}")
    return value


def _pos(key: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    if maximum is None:
        return check_int(key, value, minimum=minimum, error=ConfigError)
    return check_int(key, value, minimum=minimum, maximum=maximum, error=ConfigError)


def _caps(key: str, value: Any) -> dict[str, int]:
    if value is None:
        return {}
    _type(key, value, dict, "a map of name to int")
    out = {}
    for name, n in value.items():
        _type(f"{key}", name, str, "a map with string names")
        out[name] = _pos(f"{key}.{name}", n, 0)
    return out


def _rates(key: str, value: Any) -> dict[str, Rate]:
    """``{resource: {per_s, burst}}``: a rated node's bucket for credit blocks."""
    if value is None:
        return {}
    _type(key, value, dict, "a map of resource to {per_s, burst}")
    out = {}
    for name, r in value.items():
        _type(key, name, str, "a map with string names")
        _type(f"{key}.{name}", r, dict, "a map {per_s, burst}")
        _keys(f"{key}.{name}", r, {"per_s", "burst"})
        for part in ("per_s", "burst"):
            if part not in r:
                raise ConfigError(f"{key}.{name}.{part}", "is required")
        out[name] = Rate(
            _pos(f"{key}.{name}.per_s", r["per_s"], 0, RATE_PER_S_MAX),
            _pos(f"{key}.{name}.burst", r["burst"], 1, BURST_MAX),
        )
    return dict(sorted(out.items()))


def _addr(key: str, value: Any) -> str:
    """host:port, port 1..65535: governord serves on the port it is given, and says so."""
    _type(key, value, str, "host:port")
    return check_address(key, value, error=ConfigError)


def _keys(key: str, data: dict[str, Any], allowed: set[str]) -> None:
    check_keys(key, data, allowed, error=ConfigError)


def _defaults(key: str, value: Any) -> Defaults | None:
    if value is None:
        return None
    _type(key, value, dict, "a map")
    _keys(key, value, {"quotas", "limits", "weight", "priority", "children"})
    weight = value.get("weight")
    priority = value.get("priority")
    return Defaults(
        quotas=tuple(sorted(_caps(f"{key}.quotas", value.get("quotas")).items())),
        limits=tuple(sorted(_caps(f"{key}.limits", value.get("limits")).items())),
        weight=None if weight is None else _pos(f"{key}.weight", weight),
        priority=None
        if priority is None
        else _pos(f"{key}.priority", priority, PRIORITY_MIN, PRIORITY_MAX),
        children=_defaults(f"{key}.children", value.get("children")),
    )


def _key_digest(key: str, value: dict[str, Any], env: dict[str, str]) -> str:
    """The SHA-256 of an API key given as ``api_key_env`` or ``api_key_sha256`` (exactly one)."""
    if ("api_key_env" in value) == ("api_key_sha256" in value):
        raise ConfigError(f"{key}.api_key_env", "give exactly one of api_key_env, api_key_sha256")
    if "api_key_env" in value:
        var = _type(f"{key}.api_key_env", value["api_key_env"], str, "a variable name")
        secret = env.get(var)
        if not secret:
            raise ConfigError(f"{key}.api_key_env", f"environment variable {var} is not set")
        weak = weak_secret(secret)
        if weak is not None:
            raise ConfigError(
                f"{key}.api_key_env",
                f"the API key in ${var} {weak}; use a random one (e.g. openssl rand -hex 32)",
            )
        digest = hashlib.sha256(secret.encode()).hexdigest()
    else:
        digest = _type(f"{key}.api_key_sha256", value["api_key_sha256"], str, "64 hex digits")
        if not _HEX64.match(digest):
            raise ConfigError(f"{key}.api_key_sha256", "must be 64 lowercase hex digits")
    return str(digest)


def _tenant(key: str, name: Any, value: Any, env: dict[str, str]) -> TenantConfig:
    _type(key, name, str, "a tenant name")
    _type(key, value, dict, "a map")
    _keys(
        key,
        value,
        {"api_key_env", "api_key_sha256", "weight", "quotas", "limits", "defaults", "rates"},
    )
    digest = _key_digest(key, value, env)
    return TenantConfig(
        name=name,
        key_sha256=digest,
        weight=_pos(f"{key}.weight", value.get("weight", 1)),
        quotas=_caps(f"{key}.quotas", value.get("quotas")),
        limits=_caps(f"{key}.limits", value.get("limits")),
        defaults=_defaults(f"{key}.defaults", value.get("defaults")),
        rates=_rates(f"{key}.rates", value.get("rates")),
    )


def _coordinator(value: Any, env: dict[str, str]) -> CoordinatorSettings:
    if value is None:
        return CoordinatorSettings()
    _type("coordinator", value, dict, "a map")
    _keys("coordinator", value, {"keys", "policies_file"})
    raw_keys = _type("coordinator.keys", value.get("keys") or {}, dict, "a map of name to key")
    if len(raw_keys) > COORDINATOR_KEYS_MAX:
        raise ConfigError("coordinator.keys", f"at most {COORDINATOR_KEYS_MAX} keys")
    keys = []
    for name, spec in sorted(raw_keys.items(), key=str):
        where = f"coordinator.keys.{name}"
        _type(where, name, str, "a key name")
        _type(where, spec, dict, "a map")
        _keys(where, spec, {"api_key_env", "api_key_sha256", "scope"})
        scope = spec.get("scope")
        if scope not in KEY_SCOPES:
            raise ConfigError(
                f"{where}.scope", f"must be one of {', '.join(KEY_SCOPES)}, got {scope!r}"
            )
        keys.append(CoordinatorKey(name, _key_digest(where, spec, env), scope))
    path = value.get("policies_file")
    bootstrap: tuple[TenantRatePolicy, ...] = ()
    if path is not None:
        _type("coordinator.policies_file", path, str, "a file path")
        found = load_policy_file(path, where="coordinator.policies_file", error=ConfigError)
        bootstrap = tuple(d.policy for d in found)
    return CoordinatorSettings(tuple(keys), path, bootstrap)


def _adaptive(key: str, value: Any) -> AdaptiveConfig:
    _type(key, value, dict, "a map")
    fields = {
        "initial_limit",
        "min_limit",
        "max_limit",
        "target_p95_ms",
        "max_overload_permille",
        "min_samples",
        "interval_ms",
    }
    _keys(key, value, fields)
    for need in ("initial_limit", "min_limit", "max_limit", "target_p95_ms"):
        if need not in value:
            raise ConfigError(f"{key}.{need}", "is required")
    args = {
        k: _pos(f"{key}.{k}", v, 0, PERMILLE_MAX)
        if k == "max_overload_permille"
        else _pos(f"{key}.{k}", v)
        for k, v in value.items()
    }
    if not args["min_limit"] <= args["initial_limit"] <= args["max_limit"]:
        raise ConfigError(f"{key}.initial_limit", "must lie in [min_limit, max_limit]")
    return AdaptiveConfig(**args)


def _ha(value: Any, store: str) -> HaSettings:
    if value is None:
        return HaSettings()
    _type("ha", value, dict, "a map with lease_ms, renew_ms, advertise")
    _keys("ha", value, {"lease_ms", "renew_ms", "advertise"})
    if not parse_store(store)[0].shared:
        raise ConfigError(
            "ha", "standbys need a postgresql store; SQLite is the single-process default"
        )
    lease = _pos(
        "ha.lease_ms", value.get("lease_ms", HA_LEASE_MS), HA_LEASE_MS_MIN, HA_LEASE_MS_MAX
    )
    renew = _pos("ha.renew_ms", value.get("renew_ms", HA_RENEW_MS), 10, HA_LEASE_MS_MAX)
    if renew * 3 > lease:
        raise ConfigError("ha.renew_ms", f"must be at most a third of ha.lease_ms ({lease})")
    advertise = (
        None if value.get("advertise") is None else _addr("ha.advertise", value["advertise"])
    )
    return HaSettings(lease, renew, advertise)


# -- the HTTP pages' token (governor/server/_http.py) ---------------------------------------


def _pages(value: Any, env: dict[str, str]) -> tuple[bytes, ...]:
    """``pages: {token_file: F}`` or ``{token_env: VAR}``: the bearer token that shows
    per-tenant detail off loopback; none: that detail is served on loopback only."""
    if value is None:
        return ()
    _type("pages", value, dict, "a map with token_file or token_env")
    _keys("pages", value, {"token_file", "token_env"})
    for k in ("token_file", "token_env"):
        if k in value:
            _type(f"pages.{k}", value[k], str, "a file path" if k == "token_file" else "a name")
    token = read_api_key(
        file=value.get("token_file"),
        env=value.get("token_env"),
        where="pages.token",
        error=ConfigError,
        environ=env,
    )
    weak = weak_secret(token)
    if weak is not None:
        where = "pages.token_file" if "token_file" in value else "pages.token_env"
        raise ConfigError(where, f"the pages token {weak}; use a random one (openssl rand -hex 32)")
    return (token.encode(),)


def parse_config(data: Any, env: dict[str, str] | None = None) -> GovernordConfig:
    """Validate a decoded YAML document; raises ConfigError naming the key."""
    env = dict(os.environ) if env is None else env
    if data is None:
        data = {}
    _type("(top level)", data, dict, "a map")
    top = {
        "listen",
        "store",
        "tls",
        "allow_plaintext",
        "metrics",
        "session",
        "root",
        "adaptive",
        "tenants",
        "drain_s",
        "snapshot_every",
        "nodes_per_tenant_max",
        "coordinator",
        "ha",
        "pages",
    }
    _keys("", data, top)
    listen_raw = data.get("listen", DEFAULT_LISTEN)
    items = [listen_raw] if isinstance(listen_raw, str) else listen_raw
    _type("listen", items, list, "host:port or a list of them")
    listen = tuple(_addr(f"listen[{i}]", a) for i, a in enumerate(items))
    if not listen:
        raise ConfigError("listen", "needs at least one address")
    store = _type("store", data.get("store", DEFAULT_STORE), str, STORE_FORMS)
    parse_store(store)
    tls = None
    if data.get("tls") is not None:
        t = _type("tls", data["tls"], dict, "a map with cert and key")
        _keys("tls", t, {"cert", "key"})
        for k in ("cert", "key"):
            f = _type(f"tls.{k}", t.get(k), str, "a file path")
            if not Path(f).is_file():
                raise ConfigError(f"tls.{k}", f"no such file: {f}")
        tls = TlsFiles(t["cert"], t["key"])
    plain = check_bool("allow_plaintext", data.get("allow_plaintext", False), error=ConfigError)
    if tls is None and not plain:
        for i, a in enumerate(listen):
            if not is_loopback(a):
                raise ConfigError(
                    f"listen[{i}]",
                    f"{a} is not loopback: name a TLS certificate or set allow_plaintext: true",
                )
    metrics = None if data.get("metrics") is None else _addr("metrics", data["metrics"])
    session = _type("session", data.get("session") or {}, dict, "a map")
    _keys("session", session, {"ttl_ms", "min_ttl_ms", "max_ttl_ms"})
    root = _type("root", data.get("root") or {}, dict, "a map")
    _keys("root", root, {"quotas", "limits", "rates"})
    adaptive_raw = _type("adaptive", data.get("adaptive") or {}, dict, "a map of class to AIMD")
    tenants_raw = _type("tenants", data.get("tenants") or {}, dict, "a map of name to tenant")
    tenants = tuple(
        _tenant(f"tenants.{n}", n, v, env) for n, v in sorted(tenants_raw.items(), key=str)
    )
    seen: dict[str, str] = {}
    for t in tenants:
        if t.key_sha256 in seen:
            raise ConfigError(f"tenants.{t.name}", f"shares its API key with {seen[t.key_sha256]}")
        seen[t.key_sha256] = t.name
    coordinator = _coordinator(data.get("coordinator"), env)
    for ck in coordinator.keys:
        if ck.key_sha256 in seen:
            other = seen[ck.key_sha256]
            raise ConfigError(f"coordinator.keys.{ck.name}", f"shares its API key with {other}")
        seen[ck.key_sha256] = f"coordinator.keys.{ck.name}"
    cfg = GovernordConfig(
        listen=listen,
        store=store,
        tls=tls,
        allow_plaintext=plain,
        metrics=metrics,
        session_ttl_ms=_pos("session.ttl_ms", session.get("ttl_ms", 10_000), 1, TTL_MS_MAX),
        session_ttl_min_ms=_pos(
            "session.min_ttl_ms", session.get("min_ttl_ms", 200), 1, TTL_MS_MAX
        ),
        session_ttl_max_ms=_pos(
            "session.max_ttl_ms", session.get("max_ttl_ms", 3_600_000), 1, TTL_MS_MAX
        ),
        drain_s=check_float(
            "drain_s", data.get("drain_s", 5.0), minimum=0, maximum=DRAIN_S_MAX, error=ConfigError
        ),
        snapshot_every=_pos(
            "snapshot_every", data.get("snapshot_every", 10_000), 1, SNAPSHOT_EVERY_MAX
        ),
        nodes_per_tenant_max=_pos(
            "nodes_per_tenant_max",
            data.get("nodes_per_tenant_max", EngineConfig().nodes_per_tenant_max),
            1,
            NODES_PER_TENANT_MAX_MAX,
        ),
        root_quotas=_caps("root.quotas", root.get("quotas")),
        root_limits=_caps("root.limits", root.get("limits")),
        root_rates=_rates("root.rates", root.get("rates")),
        adaptive={str(c): _adaptive(f"adaptive.{c}", v) for c, v in adaptive_raw.items()},
        tenants=tenants,
        coordinator=coordinator,
        ha=_ha(data.get("ha"), store),
        pages_tokens=_pages(data.get("pages"), env),
    )
    if not cfg.session_ttl_min_ms <= cfg.session_ttl_ms <= cfg.session_ttl_max_ms:
        raise ConfigError("session.ttl_ms", "must lie in [min_ttl_ms, max_ttl_ms]")
    return cfg


def load_config(path: str, env: dict[str, str] | None = None) -> GovernordConfig:
    """Read and validate a YAML file; every mistake is a ConfigError naming the file or key."""
    return parse_config(load_yaml(path, field="config", error=ConfigError), env)


def config_warnings(cfg: GovernordConfig) -> list[str]:
    """Legal but exposed: a listener on every interface that asks no credential, or that
    carries credentials in clear. One line each; `governord validate` prints them."""
    out = []
    if cfg.tls is None:
        for i, addr in enumerate(cfg.listen):
            if is_wildcard(addr):
                out.append(
                    f"listen[{i}]: {addr} is every interface in plaintext (allow_plaintext): "
                    "API keys and session tokens cross the network in clear; configure tls"
                )
    if cfg.metrics is not None and is_wildcard(cfg.metrics) and not cfg.pages_tokens:
        out.append(
            f"metrics: {cfg.metrics} is every interface with no pages token: callers off "
            "this host get no tenant detail (/ui, /ui/status, per-tenant /metrics series, "
            "which the shipped alerts read); set pages.token_file and give it to Prometheus"
        )
    return out


def default_config() -> GovernordConfig:
    return GovernordConfig()
