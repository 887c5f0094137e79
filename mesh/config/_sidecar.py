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

      token_file: /etc/ratemesh/sidecar-token   # the callers' bearer token (or token_env)

A listen address that is not loopback (or `require_auth`) needs a bearer token, sent as
`authorization: Bearer <token>` (gRPC metadata or HTTP header), or mutual TLS
(`tls.require_client_cert`: a client certificate from the fleet's CA); a node with neither
refuses to start. The token is the sidecar's own (`token_file` / `token_env`), so the
workers that call it never hold the peer port's credential; without one it is the fleet
secret, which also lets its holder speak to peers as a member (`mesh validate` warns about
that, and about a token equal to the fleet secret). The token is at least 16 bytes and no
placeholder (`ratemesh.secretcheck`). With `tls` set, a non-loopback sidecar serves TLS.
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
    "SIDECAR_CONCURRENT_MAX",
    "SIDECAR_ITEMS_MAX",
    "SIDECAR_MESSAGE_BYTES_MAX",
    "SidecarConfig",
    "check_sidecar_auth",
    "parse_sidecar",
]

SIDECAR_ITEMS_MAX = 1000  # a GetRateLimits-sized batch; a bigger one is split by the caller
SIDECAR_MESSAGE_BYTES_MAX = 4 << 20  # 1000 items of long names fit many times over
SIDECAR_CONCURRENT_MAX = 256  # workers on one host rarely need more in flight at once
_KEYS = {
    "grpc_listen",
    "http_listen",
    "require_auth",
    "items_max",
    "max_message_bytes",
    "concurrent_max",
    "token_file",
    "token_env",
}


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
        token = read_api_key(
            file=None if data.get("token_file") is None else str(data["token_file"]),
            env=None if data.get("token_env") is None else str(data["token_env"]),
            where="sidecar.token",
            error=ConfigError,
        )
        where = "sidecar.token_file" if data.get("token_file") is not None else "sidecar.token_env"
        weak = weak_secret(token)
        if weak is not None:
            raise ConfigError(
                where, f"the sidecar token {weak}; use a random one (e.g. openssl rand -hex 32)"
            )
        kw["tokens"] = (token.encode(),)
        kw["token_from"] = where
    return SidecarConfig(**kw)


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
