"""The node config's `sidecar:` section: the admission API a worker in any language calls
(docs/sidecar.md). Off unless an address is set::

    sidecar:
      grpc_listen: 127.0.0.1:7002   # gRPC ratemesh.sidecar.v1.Admission (omit: off)
      http_listen: 127.0.0.1:7003   # POST /v1/admit|charge|refund, GET /metrics|/health
                                    # (omit: off; equal to telemetry_listen: one server)
      require_auth: false           # true: a bearer token even on loopback
      items_max: 1000               # items in one call (gRPC Admit, an HTTP batch)
      max_message_bytes: 4194304    # one gRPC message or HTTP body
      concurrent_max: 256           # calls (gRPC) / connections (HTTP) served at once

      peer_connections_max: 128     # HTTP connections from one address (docs/security.md)
      token_file: /etc/ratemesh/sidecar-token   # the callers' bearer token (or token_env)

      # who may cool a limit (POST/DELETE /v1/cooldown, docs/cooldown.md) and read
      # per-tenant detail off loopback (/health's detail, /metrics' tenant series, /ui)
      operator_token_file: /etc/ratemesh/operator-token   # (or operator_token_env)
      tenant_tokens:                # a tenant's own token: cooldown of its own limits only
        acme: {token_file: /etc/ratemesh/acme-token}      # (or token_env)
      cooldown_max_s: 300           # the longest cooldown a caller may ask for
      http_status_on_deny: 200      # 429: an HTTP denial is 429 with Retry-After

A listen address that is not loopback (or `require_auth`) needs a bearer token, sent as
`authorization: Bearer <token>` (gRPC metadata or HTTP header), or mutual TLS
(`tls.require_client_cert`: a client certificate from the fleet's CA); a node with neither
refuses to start. The token is the sidecar's own (`token_file` / `token_env`), so the
workers that call it never hold the peer port's credential; without one it is the fleet
secret, which also lets its holder speak to peers as a member (`mesh validate` warns about
that, and about a token equal to the fleet secret). The token is at least 16 bytes and no
placeholder (`ratemesh.secretcheck`). With `tls` set, a non-loopback sidecar serves TLS.

A cooldown stops a tenant's limit fleet-wide, so it is never open to whoever reaches the
port: it needs the operator's token (any tenant with a policy) or that tenant's own token,
sent as `x-ratemesh-token: <token>` (the `authorization` header stays the admission API's);
with neither configured, `/v1/cooldown` answers 403.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mesh.core._validate import check_bool, check_int, check_str
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.apikey import read_api_key
from ratemesh.checks import check_address, check_keys, is_loopback
from ratemesh.secretcheck import weak_secret

__all__ = [
    "COOLDOWN_MAX_S_DEFAULT",
    "DENY_STATUSES",
    "SIDECAR_CONCURRENT_MAX",
    "SIDECAR_PEER_CONNECTIONS_MAX",
    "TENANT_TOKENS_MAX",
    "SIDECAR_ITEMS_MAX",
    "SIDECAR_MESSAGE_BYTES_MAX",
    "SidecarConfig",
    "check_sidecar_auth",
    "parse_sidecar",
]

SIDECAR_ITEMS_MAX = 1000  # a GetRateLimits-sized batch; a bigger one is split by the caller
SIDECAR_MESSAGE_BYTES_MAX = 4 << 20  # 1000 items of long names fit many times over
SIDECAR_CONCURRENT_MAX = 256  # workers on one host rarely need more in flight at once
SIDECAR_PEER_CONNECTIONS_MAX = 128  # half the port: one address cannot take it all
TENANT_TOKENS_MAX = 4096  # tenant_tokens entries (a tenant per policy at most)
COOLDOWN_MAX_S_DEFAULT = 300.0  # a back-off of minutes; an operator may allow up to an hour
COOLDOWN_MAX_S_LIMIT = 3600.0  # COOLDOWN_MS_MAX of the wire
_KEYS = {
    "grpc_listen",
    "http_listen",
    "require_auth",
    "items_max",
    "max_message_bytes",
    "concurrent_max",
    "token_file",
    "token_env",
    "peer_connections_max",
    "operator_token_file",
    "operator_token_env",
    "tenant_tokens",
    "cooldown_max_s",
    "http_status_on_deny",
}
DENY_STATUSES = (200, 429)  # a denial is an answer (200, as before) or Too Many Requests


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    grpc_listen: str | None = None
    http_listen: str | None = None
    require_auth: bool = False
    items_max: int = SIDECAR_ITEMS_MAX
    max_message_bytes: int = SIDECAR_MESSAGE_BYTES_MAX
    concurrent_max: int = SIDECAR_CONCURRENT_MAX
    tokens: tuple[bytes, ...] = field(default=(), repr=False)  # token_file / token_env
    token_from: str | None = None  # "sidecar.token_file" or "sidecar.token_env"
    peer_connections_max: int = SIDECAR_PEER_CONNECTIONS_MAX
    operator_tokens: tuple[bytes, ...] = field(default=(), repr=False)
    tenant_tokens: dict[str, bytes] = field(default_factory=dict, repr=False)
    cooldown_max_s: float = COOLDOWN_MAX_S_DEFAULT
    http_status_on_deny: int = 200  # docs/sidecar.md, "HTTP status and RateLimit fields"

    def listens(self) -> list[tuple[str, str]]:
        """(field, address) for each address the sidecar binds."""
        out = [("sidecar.grpc_listen", self.grpc_listen), ("sidecar.http_listen", self.http_listen)]
        return [(f, a) for f, a in out if a]

    def needs_auth(self, address: str) -> bool:
        return self.require_auth or not is_loopback(address)


def parse_sidecar(data: Any) -> SidecarConfig:
    if not isinstance(data, dict):
        raise ConfigTypeError("sidecar", f"must be a mapping, got {type(data).__name__}")
    check_keys("sidecar", data, _KEYS, error=ConfigError)
    kw: dict[str, Any] = {}
    for name in ("grpc_listen", "http_listen"):
        if data.get(name) is not None:
            where = f"sidecar.{name}"
            kw[name] = check_address(
                where, check_str(where, data[name]), allow_zero_port=True, error=ConfigError
            )
    if "require_auth" in data:
        kw["require_auth"] = check_bool("sidecar.require_auth", data["require_auth"])
    if "items_max" in data:
        kw["items_max"] = check_int(
            "sidecar.items_max", data["items_max"], minimum=1, maximum=100_000
        )
    if "max_message_bytes" in data:
        kw["max_message_bytes"] = check_int(
            "sidecar.max_message_bytes", data["max_message_bytes"], minimum=1024, maximum=1 << 30
        )
    if "concurrent_max" in data:
        kw["concurrent_max"] = check_int(
            "sidecar.concurrent_max", data["concurrent_max"], minimum=1, maximum=100_000
        )
    if data.get("token_file") is not None or data.get("token_env") is not None:
        where, token = _token(data, "sidecar", "token", "the sidecar token")
        kw["tokens"] = (token,)
        kw["token_from"] = where
    if "peer_connections_max" in data:
        kw["peer_connections_max"] = check_int(
            "sidecar.peer_connections_max", data["peer_connections_max"], minimum=1,
            maximum=100_000,
        )  # fmt: skip
    if data.get("operator_token_file") is not None or data.get("operator_token_env") is not None:
        kw["operator_tokens"] = (
            _token(data, "sidecar", "operator_token", "the operator token")[1],
        )
    if data.get("tenant_tokens") is not None:
        kw["tenant_tokens"] = _tenant_tokens(data["tenant_tokens"])
    if "cooldown_max_s" in data:
        v = data["cooldown_max_s"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigTypeError("sidecar.cooldown_max_s", f"must be seconds, got {v!r}")
        if not 0 < v <= COOLDOWN_MAX_S_LIMIT:
            raise ConfigError(
                "sidecar.cooldown_max_s", f"must be in (0, {COOLDOWN_MAX_S_LIMIT:g}], got {v}"
            )
        kw["cooldown_max_s"] = float(v)
    if "http_status_on_deny" in data:
        v = data["http_status_on_deny"]
        if type(v) is not int or v not in DENY_STATUSES:
            raise ConfigError("sidecar.http_status_on_deny", f"must be 200 or 429, got {v!r}")
        kw["http_status_on_deny"] = v
    operator = kw.get("operator_tokens", ())
    for tenant, token in kw.get("tenant_tokens", {}).items():
        if token in operator or token in kw.get("tokens", ()):
            raise ConfigError(
                f"sidecar.tenant_tokens.{tenant}",
                "is the operator's or the workers' token: give each tenant a token of its own",
            )
    if operator and operator[0] in kw.get("tokens", ()):
        raise ConfigError(
            "sidecar.operator_token_file",
            "is the workers' token (token_file): the operator's must be another",
        )
    return SidecarConfig(**kw)


def _token(data: dict[str, Any], where: str, name: str, what: str) -> tuple[str, bytes]:
    """(the field it came from, the token) from `<name>_file` or `<name>_env` under `where`;
    a guessable token is refused (ratemesh.secretcheck), naming that field."""
    file_key, env_key = f"{name}_file", f"{name}_env"
    field_ = f"{where}.{file_key if data.get(file_key) is not None else env_key}"
    token = read_api_key(
        file=None
        if data.get(file_key) is None
        else check_str(f"{where}.{file_key}", data[file_key]),
        env=None if data.get(env_key) is None else check_str(f"{where}.{env_key}", data[env_key]),
        where=f"{where}.{name}",
        error=ConfigError,
    )
    weak = weak_secret(token)
    if weak is not None:
        raise ConfigError(field_, f"{what} {weak}; use a random one (e.g. openssl rand -hex 32)")
    return field_, token.encode()


def _tenant_tokens(raw: Any) -> dict[str, bytes]:
    """{tenant: {token_file | token_env}}: each tenant's own token; no two alike."""
    if not isinstance(raw, dict):
        raise ConfigTypeError(
            "sidecar.tenant_tokens", f"must be a map of tenant to token, got {type(raw).__name__}"
        )
    if len(raw) > TENANT_TOKENS_MAX:
        raise ConfigError("sidecar.tenant_tokens", f"at most {TENANT_TOKENS_MAX} tenants")
    out: dict[str, bytes] = {}
    seen: dict[bytes, str] = {}
    for tenant, spec in sorted(raw.items(), key=str):
        where = f"sidecar.tenant_tokens.{tenant}"
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError("sidecar.tenant_tokens", f"{tenant!r}: a tenant is a name")
        if not isinstance(spec, dict):
            raise ConfigTypeError(where, "must be {token_file: F} or {token_env: VAR}")
        check_keys(where, spec, {"token_file", "token_env"}, error=ConfigError)
        token = _token(spec, where, "token", f"tenant {tenant}'s token")[1]
        if token in seen:
            raise ConfigError(where, f"has the same token as tenant {seen[token]}")
        seen[token] = tenant
        out[tenant] = token
    return out


def check_sidecar_auth(
    sc: SidecarConfig, *, fleet_secret: bool, mtls: bool, tls: bool, allow_plaintext: bool
) -> None:
    """Refuse (ConfigError naming the address's field) a sidecar reachable beyond loopback
    without the peer port's credentials, or in plaintext without `allow_plaintext`."""
    for where, addr in sc.listens():
        if not sc.needs_auth(addr):
            continue
        loopback = is_loopback(addr)
        if not fleet_secret and not sc.tokens and not (mtls and not loopback):
            why = "require_auth is true" if loopback else f"{addr} is not a loopback address"
            raise ConfigError(
                where,
                f"{why}: the sidecar needs its callers' credentials; set sidecar.token_file "
                "(or sidecar.token_env, or the fleet secret: callers send it as a bearer token)"
                + ("" if loopback else ", or tls with require_client_cert"),
            )
        if not loopback and not tls and not allow_plaintext:
            raise ConfigError(
                where,
                f"{addr} is not a loopback address: configure tls, or set "
                "allow_plaintext: true to accept plaintext callers",
            )
