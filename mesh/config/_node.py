"""A mesh node's configuration: one YAML file, validated with errors that name the key.

Shape (every key optional except where said)::

    member_id: a                 # identity: this, else $member_id_env, else hostname-pid-nonce
    member_id_env: POD_NAME
    listen: 127.0.0.1:7001       # the peer service (gRPC); port 0: any free port
    advertise: 10.0.0.5:7001     # what other members dial (default: listen, bound port)
    telemetry_listen: 127.0.0.1:9101   # /metrics and /health (omit: off); port 0: any free
    telemetry_top_k: 50          # tenants with their own series; the rest are tenant="other"
    allow_plaintext: false       # needed for a non-loopback address without tls
    tls: {cert: f, key: f, ca: f, require_client_cert: true}
    fleet_secret_file: secret   # or fleet_secret_env: RATEMESH_FLEET_SECRET (one of them);
                                # one secret a line, the first signs, all are accepted
    max_message_bytes: 4194304
    shutdown_drain_ms: 500
    membership:
      source: static             # or etcd, or dns
      members: {a: 127.0.0.1:7001, b: 127.0.0.1:7002}
      endpoints: [http://127.0.0.1:2379]   # etcd
      prefix: /ratemesh/members/
      lease_ttl_s: 5
      name: ratemesh.default.svc.cluster.local   # dns: a headless service
      record: a                  # dns: a (port below) or srv (ports from the records)
      port: 7001
      nameservers: [10.96.0.10]  # dns: default the system's resolv.conf
      interval_ms: 1000          # dns: re-resolve period
      epoch_slot_ms: 30000       # dns: see mesh/membership/_dns.py
    policies:
      file: policies.yaml        # reloaded on SIGHUP and when it changes (mesh/node/_reload.py)
      watch_ms: 1000             # how often the file is checked for a change; 0: SIGHUP only
      inline: [{tenant_id: acme, metric: read_iops, generation: 1, ...}]
      coordinator: {addr: 127.0.0.1:7100, poll_ttl_ms: 1000, api_key_file: worker.key}
                                 # governord; or api_key_env: NAME (a worker-scope key);
                                 # ca: F verifies governord's TLS certificate; addr may
                                 # list governord's leader and standbys ([a:7100, b:7100]
                                 # or "a:7100,b:7100"): the node follows the leader
    core: {sync_interval_ms: 5, snapshot_ttl_ms: 20}
    strict: {governord: 127.0.0.1:7443, api_key_file: tenant.key, node: 12}
                                 # credit for strict limits (mesh/config/_strict.py)
    sidecar: {grpc_listen: 127.0.0.1:7002, http_listen: 127.0.0.1:9101}
                                 # the admission API for workers in any language, off by
                                 # default (mesh/config/_sidecar.py, docs/sidecar.md)
    shared_state:
      redis: {external: allow, addr: 10.0.0.10:6379, password_env: NAME, tls: true}
                                 # consent to dial a network redis for redis-mode limits
                                 # (mesh/config/_sharedstate.py, docs/redis.md)
    envoy_rls: {config_files: [ratelimit/config.yaml]}
                                 # envoyproxy/ratelimit rule files, served to Envoy on the
                                 # sidecar's gRPC port (mesh/config/_envoy.py)

Ports are 1..65535. Only `listen`, `telemetry_listen` and the sidecar's addresses also take
0, "any free port": the node reads the bound port back and reports it (`Mesh.address`,
`Mesh.telemetry_address`, `Mesh.sidecar_addresses`), and what other members dial is that
address. An IPv6 host goes in brackets: `[::1]:7001`.

Peer identity (docs/architecture.md): with `tls.require_client_cert` a peer's member id must
match its certificate; with a fleet secret (>= 16 bytes and not guessable: no placeholder or
pattern, `ratemesh.secretcheck`; read from the file or the variable at load, never written in
the config) it must prove it with an HMAC. Neither is a warning.

Loading does no I/O beyond reading the files it names; `warnings()` lists what is legal but
probably a mistake (`mesh validate` prints them).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesh.config._envoy import EnvoyRlsConfig, parse_envoy_rls
from mesh.config._files import config_file
from mesh.config._replica import check_replica_name
from mesh.config._sharedstate import SharedStateConfig, parse_shared_state
from mesh.config._sidecar import SidecarConfig, check_sidecar_auth, parse_sidecar
from mesh.config._strict import StrictConfig, parse_strict, strict_findings
from mesh.core._validate import check_bool, check_int, check_str
from mesh.core.config import CoreConfig
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.core.policy import Mode, TenantRatePolicy
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.apikey import read_api_key
from ratemesh.checks import (
    check_address,
    check_addresses,
    check_keys,
    is_loopback,
    is_wildcard,
)
from ratemesh.policyfile import load_policy_file as read_policy_file
from ratemesh.secretcheck import SECRET_MIN_BYTES, weak_secret
from ratemesh.yamlfile import load_yaml

# A node's peer streams are reliable and report reconnections, so a report is resent on a
# reconnect at once and otherwise only as a safety net: a slow owner is not sent more work.
NODE_RETRY_MAX_MS = 1000
FLEET_SECRET_MIN_BYTES = SECRET_MIN_BYTES  # shorter is guessable (no placeholders either)
FLEET_SECRET_MAX_BYTES = 4096  # a secret file is a few lines, not a document
FLEET_SECRETS_MAX = 3  # secrets accepted at once (a rotation needs two)
# How often a node compares its policy file's stat (and, when that moved, its hash) with what
# it last loaded: a second is quick for an operator's edit and costs one stat() a second.
POLICY_WATCH_MS = 1000

__all__ = [
    "FLEET_SECRET_MIN_BYTES",
    "POLICY_WATCH_MS",
    "NodeConfig",
    "TlsConfig",
    "MembershipConfig",
    "CoordinatorConfig",
    "Identity",
    "load_config",
    "parse_config",
    "resolve_identity",
    "is_loopback",
    "load_policy_file",
]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificate files for the peer service; `ca` set means peers are verified."""

    cert: str
    key: str
    ca: str | None = None
    require_client_cert: bool = False  # mutual TLS
    server_name: str | None = None  # override the name checked in peers' certificates


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    source: str = "static"
    members: dict[str, str] = field(default_factory=dict)  # static: member id -> address
    endpoints: tuple[str, ...] = ()
    prefix: str = "/ratemesh/members/"
    lease_ttl_s: int = 5
    poll_ms: int = 1000  # etcd: how soon to retry after losing the watch
    name: str = ""  # dns: the name whose A or SRV records list the members
    record: str = "a"  # dns: a | srv
    port: int = 0  # dns, A records: the members' peer port
    nameservers: tuple[tuple[str, int], ...] = ()  # dns: (ip, port); empty: resolv.conf
    interval_ms: int = 1000  # dns: re-resolve period (wall-clock aligned)
    epoch_slot_ms: int = 30_000  # dns: epochs re-stamp at each slot's start


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    addr: str  # host:port, or several comma-separated (governord's leader and standbys)
    poll_ttl_ms: int = 1000  # polling fallback period while the watch is down
    # governord's coordinator API key (a worker-scope key: list, watch, history), read from
    # api_key_file or api_key_env; None for a coordinator without auth (tests, demos)
    api_key: str | None = field(default=None, repr=False)
    ca: str | None = None  # verify governord's TLS certificate against this (else `tls`'s)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who this replica is, where the name came from, and whether it survives a restart."""

    member_id: str
    source: str  # config | env | hostname (hostname-pid-nonce) | nonce (member-pid-nonce)
    stable: bool  # only config and env ids survive a restart


@dataclass(frozen=True, slots=True)
class NodeConfig:
    member_id: str | None = None
    member_id_env: str | None = None
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    telemetry_listen: str | None = None
    telemetry_top_k: int = 50  # per-tenant series: the top K by denials and excess
    allow_plaintext: bool = False
    tls: TlsConfig | None = None
    # proves membership to peers (mesh/peer/_identity.py); never printed (repr=False)
    fleet_secret: bytes | None = field(default=None, repr=False)  # signs our streams
    fleet_secrets_accepted: tuple[bytes, ...] = field(default=(), repr=False)  # verify theirs
    fleet_secret_from: str | None = None  # fleet_secret_file: PATH | fleet_secret_env: NAME
    max_message_bytes: int = MAX_MESSAGE_BYTES
    shutdown_drain_ms: int = 500
    membership: MembershipConfig | None = None
    policies: tuple[TenantRatePolicy, ...] = ()
    policy_file: str | None = None
    policy_watch_ms: int = POLICY_WATCH_MS  # 0: reload the file on SIGHUP only
    coordinator: CoordinatorConfig | None = None
    strict: StrictConfig | None = None  # None: strict limits fail closed (no credit source)
    sidecar: SidecarConfig = field(default_factory=SidecarConfig)  # off: no address set
    shared_state: SharedStateConfig = field(default_factory=SharedStateConfig)  # none: no dial
    envoy_rls: EnvoyRlsConfig | None = None  # its limits are in `policies` too
    core: CoreConfig = field(
        default_factory=lambda: CoreConfig(report_retry_max_ms=NODE_RETRY_MAX_MS)
    )

    def identity(self, environ: dict[str, str] | None = None) -> Identity:
        return resolve_identity(self, environ)

    def warnings(self) -> list[str]:
        """Legal but probably wrong: shown by `mesh validate`, logged by `mesh node`."""
        out = []
        addrs = {"listen": self.listen}
        if self.advertise:
            addrs["advertise"] = self.advertise
        if self.membership and self.membership.source == "static":
            addrs.update({f"membership.members.{k}": v for k, v in self.membership.members.items()})
        if self.tls is None:
            for where, addr in sorted(addrs.items()):
                if not is_loopback(addr):
                    out.append(f"{where}: peer address {addr} without tls (plaintext)")
        elif self.tls.ca is None:
            out.append("tls.ca: not set; peers' certificates are not verified against a CA")
        if self.fleet_secret is None and (self.tls is None or not self.tls.require_client_cert):
            out.append(
                "fleet_secret_file: no fleet secret and no client certificates "
                "(tls.require_client_cert): any process that can reach this member's port "
                "can claim to be any member; set fleet_secret_file or fleet_secret_env"
            )
        out += self._exposure_warnings()
        secret_file = (self.fleet_secret_from or "").partition("fleet_secret_file: ")[2]
        if secret_file and _readable_by_others(secret_file):
            out.append(
                f"fleet_secret_file: {secret_file} is readable by group or others (chmod 600)"
            )
        if any(p.mode is Mode.SHARE for p in self.policies) and (
            self.membership is None
            or (self.membership.source == "static" and len(self.membership.members) <= 1)
        ):
            out.append(
                "membership: a share-mode policy with no membership source; "
                "N_live is 1, so each member enforces the whole limit"
            )
        if self.strict is None and any(p.mode is Mode.STRICT for p in self.policies):
            out.append(
                "strict: a strict-mode policy with no strict section (no governord credit); "
                "it is refused with governor_unreachable"
            )
        out += strict_findings(self.strict, self.policies)
        redis = self.shared_state.redis
        if redis is not None:
            out += redis.warnings()
        elif any(p.mode is Mode.REDIS for p in self.policies):
            out.append(
                "shared_state.redis: a redis-mode policy with no shared_state.redis (nothing "
                "dials); each process enforces it alone (fleet <= N x limit), every verdict "
                "suspended redis_unreachable"
            )
        if self.shared_state.postgres is not None:
            out += self.shared_state.postgres.warnings()
        if not self.policies and self.coordinator is None:
            out.append(
                "policies: none configured and no coordinator; every tenant is "
                "refused with policy_unknown"
            )
        ident = self.identity()
        if self.membership is not None and self.membership.source == "dns":
            out += _dns_warnings(self, ident.member_id)
        if not ident.stable:
            out.append(_unstable_warning(self, ident))
        return out

    def _exposure_warnings(self) -> list[str]:
        """Who holds which credential, and what every interface hears (docs/security.md)."""
        out = []
        sc = self.sidecar
        if sc.tokens and set(sc.tokens) & set(self.fleet_secrets_accepted):
            out.append(
                f"{sc.token_from}: the sidecar token is a fleet secret: every worker that "
                "calls the sidecar could speak to peers as any member; give the sidecar a "
                "token of its own (openssl rand -hex 32)"
            )
        mtls = self.tls is not None and self.tls.require_client_cert
        for where, addr in sc.listens():
            if not is_loopback(addr) and not sc.tokens and not mtls:
                out.append(
                    f"{where}: {addr} takes the fleet secret as its callers' token, so every "
                    "worker would hold the peer port's credential; set sidecar.token_file "
                    "(or sidecar.token_env) to a token of the sidecar's own"
                )
        if is_wildcard(self.listen) and self.fleet_secret is None and not mtls:
            out.append(
                f"listen: {self.listen} is every interface and asks no credential "
                "(no fleet secret, no client certificates)"
            )
        if (
            self.telemetry_listen
            and is_wildcard(self.telemetry_listen)
            and not self.sidecar.operator_tokens
        ):
            out.append(
                f"telemetry_listen: {self.telemetry_listen} is every interface with no "
                "operator token: callers off this host get no tenant detail (/ui, full "
                "/health, per-tenant /metrics series, which the shipped alerts read); set "
                "sidecar.operator_token_file and give it to Prometheus"
            )
        return out


def _readable_by_others(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & 0o077)
    except OSError:
        return False


def _unstable_warning(cfg: NodeConfig, ident: Identity) -> str:
    why = (
        f"member_id not set and ${cfg.member_id_env} (member_id_env) is unset"
        if cfg.member_id_env
        else "member_id not set"
    )
    return (
        f"member_id: {why}; each process names itself "
        f"{'hostname' if ident.source == 'hostname' else 'member'}-pid-nonce "
        f"(e.g. {ident.member_id!r}), unique but not stable: a restart joins as a new "
        "member; pin it with member_id or member_id_env"
    )


def resolve_identity(cfg: NodeConfig, environ: dict[str, str] | None = None) -> Identity:
    """config, then the environment variable named in config (both stable), else an id of
    this process: hostname-pid-nonce (or member-pid-nonce without a hostname), not stable.

    Why not the bare hostname: processes sharing a host and a config took the same id, the
    ring saw one member and each enforced the whole limit. The pid tells apart
    processes on one host; the nonce, processes in pid namespaces that share a hostname.
    """
    env = os.environ if environ is None else environ
    if cfg.member_id:
        return Identity(cfg.member_id, "config", True)
    if cfg.member_id_env and env.get(cfg.member_id_env):
        name = env[cfg.member_id_env]
        check_replica_name(f"member_id_env (${cfg.member_id_env})", name)
        return Identity(name, "env", True)
    host = socket.gethostname()
    if host:
        return Identity(f"{host}-{_process_tag()}", "hostname", False)
    return Identity(f"member-{_process_tag()}", "nonce", False)


_TAG: list[tuple[int, str]] = []  # (pid, "pid-nonce"): one per process, renewed after fork


def _process_tag() -> str:
    """`pid-nonce`, the same for every call in this process (config warnings and the node
    must name the same id), a new one in a forked child."""
    pid = os.getpid()
    if not _TAG or _TAG[0][0] != pid:
        _TAG[:] = [(pid, f"{pid}-{secrets.token_hex(3)}")]
    return _TAG[0][1]


# -- parsing ----------------------------------------------------------------------------------

_TOP = {
    "member_id",
    "member_id_env",
    "listen",
    "advertise",
    "telemetry_listen",
    "telemetry_top_k",
    "allow_plaintext",
    "tls",
    "fleet_secret_file",
    "fleet_secret_env",
    "max_message_bytes",
    "shutdown_drain_ms",
    "membership",
    "policies",
    "core",
    "strict",
    "sidecar",
    "shared_state",
    "envoy_rls",
}


def load_config(path: str | Path) -> NodeConfig:
    """Read and validate a YAML config file (policy files it names are resolved beside it)."""
    p = Path(path)
    data = load_yaml(p, field="config", error=ConfigError)
    return parse_config(data if data is not None else {}, base=p.parent)


def parse_config(data: Any, *, base: Path | None = None) -> NodeConfig:
    if not isinstance(data, dict):
        raise ConfigTypeError("config", f"must be a mapping, got {type(data).__name__}")
    _no_unknown("", data, _TOP)
    kw: dict[str, Any] = {}
    for name in ("member_id", "member_id_env", "advertise", "telemetry_listen"):
        if data.get(name) is not None:
            kw[name] = check_str(name, data[name])
    if "member_id" in kw:
        check_replica_name("member_id", kw["member_id"])
    if "listen" in data:
        kw["listen"] = check_str("listen", data["listen"])
    for name in ("listen", "advertise", "telemetry_listen"):
        if name in kw:
            # Port 0 is "any free port" only where this node binds and reports the result.
            _address(name, kw[name], allow_zero=name != "advertise")
    if "telemetry_top_k" in data:
        kw["telemetry_top_k"] = check_int(
            "telemetry_top_k", data["telemetry_top_k"], minimum=1, maximum=10_000
        )
    if "allow_plaintext" in data:
        kw["allow_plaintext"] = check_bool("allow_plaintext", data["allow_plaintext"])
    if "max_message_bytes" in data:
        kw["max_message_bytes"] = check_int(
            "max_message_bytes", data["max_message_bytes"], minimum=1024, maximum=1 << 30
        )
    if "shutdown_drain_ms" in data:
        kw["shutdown_drain_ms"] = check_int(
            "shutdown_drain_ms", data["shutdown_drain_ms"], maximum=600_000
        )
    if data.get("tls") is not None:
        kw["tls"] = _tls(data["tls"], base)
    kw.update(_fleet_secret(data, base))
    if data.get("membership") is not None:
        kw["membership"] = _membership(data["membership"])
    if data.get("policies") is not None:
        kw.update(_policies(data["policies"], base))
    if data.get("strict") is not None:
        kw["strict"] = parse_strict(data["strict"], base)
    if data.get("sidecar") is not None:
        kw["sidecar"] = parse_sidecar(data["sidecar"])
    if data.get("shared_state") is not None:
        kw["shared_state"] = parse_shared_state(data["shared_state"])
    if data.get("envoy_rls") is not None:
        envoy = kw["envoy_rls"] = parse_envoy_rls(data["envoy_rls"], base)
        kw["policies"] = (*kw.get("policies", ()), *envoy.policies())
    core = data.get("core")
    if core is None:
        core = {}
    if isinstance(core, dict) and "report_retry_max_ms" not in core:
        floor = core.get("report_retry_ms")
        core = {
            **core,
            "report_retry_max_ms": max(NODE_RETRY_MAX_MS, floor)
            if type(floor) is int
            else NODE_RETRY_MAX_MS,
        }
    kw["core"] = CoreConfig.from_dict(core)
    cfg = NodeConfig(**kw)
    if cfg.envoy_rls is not None and cfg.sidecar.grpc_listen is None:
        raise ConfigError(
            "envoy_rls", "is served on the sidecar's gRPC port: set sidecar.grpc_listen"
        )
    _check_plaintext(cfg)
    check_sidecar_auth(
        cfg.sidecar,
        fleet_secret=cfg.fleet_secret is not None,
        mtls=cfg.tls is not None and cfg.tls.require_client_cert,
        tls=cfg.tls is not None,
        allow_plaintext=cfg.allow_plaintext,
    )
    return cfg


def _no_unknown(where: str, data: dict[str, Any], known: set[str]) -> None:
    check_keys(where, data, known, error=ConfigError)


def _address(where: str, value: str, *, allow_zero: bool = False) -> None:
    """host:port with a port in 1..65535 (0 too where `allow_zero`: see the module doc)."""
    check_address(where, value, allow_zero_port=allow_zero, error=ConfigError)


def _tls(data: Any, base: Path | None) -> TlsConfig:
    if not isinstance(data, dict):
        raise ConfigTypeError("tls", f"must be a mapping, got {type(data).__name__}")
    _no_unknown("tls", data, {"cert", "key", "ca", "require_client_cert", "server_name"})
    for field_name in ("cert", "key"):
        if field_name not in data:
            raise ConfigError(f"tls.{field_name}", "is required when tls is set")
    require = check_bool("tls.require_client_cert", data.get("require_client_cert", False))
    ca = config_file("tls.ca", data["ca"], base) if data.get("ca") is not None else None
    if require and ca is None:
        raise ConfigError("tls.ca", "is required when require_client_cert is true")
    name = data.get("server_name")
    return TlsConfig(
        config_file("tls.cert", data["cert"], base),
        config_file("tls.key", data["key"], base),
        ca,
        require,
        check_str("tls.server_name", name) if name else None,
    )


def read_fleet_secret(path: str) -> bytes:
    """The signing secret in a fleet secret file (its first line), checked as a node's
    `fleet_secret_file` is: for a caller outside the mesh (`mesh status --fleet-secret-file`).
    A mistake is a ConfigError naming `fleet_secret_file`."""
    secret: bytes = _fleet_secret({"fleet_secret_file": path}, None)["fleet_secret"]
    return secret


def _fleet_secret(data: dict[str, Any], base: Path | None) -> dict[str, Any]:
    """The secret from the file or variable the config names (never the config text
    itself); every mistake names the field. One secret a line: the first signs, every line
    is accepted (at most FLEET_SECRETS_MAX), so a fleet rotates one node at a time with no
    moment two members refuse each other: add the new secret as a second line on every node,
    then move it first, then drop the old line."""
    path, env = data.get("fleet_secret_file"), data.get("fleet_secret_env")
    if path is not None and env is not None:
        raise ConfigError("fleet_secret_env", "set fleet_secret_file or fleet_secret_env, not both")
    if path is not None:
        where, name = "fleet_secret_file", config_file("fleet_secret_file", path, base)
        try:
            with open(name, "rb") as f:
                raw = f.read(FLEET_SECRET_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(where, f"cannot read {name}: {exc.strerror or exc}") from exc
        what = f"file {name}"
    elif env is not None:
        where, name = "fleet_secret_env", check_str("fleet_secret_env", env, max_len=256)
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(where, f"${name} is not set (it should hold the fleet secret)")
        raw, what = value.encode(), f"${name}"
    else:
        return {}
    if len(raw) > FLEET_SECRET_MAX_BYTES:
        raise ConfigError(where, f"{what} is longer than {FLEET_SECRET_MAX_BYTES} bytes")
    secrets_ = [line.strip() for line in raw.splitlines() if line.strip()]
    if not secrets_:
        raise ConfigError(where, f"{what} is empty")
    if len(secrets_) > FLEET_SECRETS_MAX:
        raise ConfigError(
            where, f"{what} holds {len(secrets_)} secrets; at most {FLEET_SECRETS_MAX} (one a line)"
        )
    for i, secret in enumerate(secrets_):
        line = f" (line {i + 1})" if len(secrets_) > 1 else ""
        if len(secret) < FLEET_SECRET_MIN_BYTES:
            raise ConfigError(
                where,
                f"{what}{line} holds {len(secret)} bytes; a fleet secret needs at least "
                f"{FLEET_SECRET_MIN_BYTES} (e.g. openssl rand -hex 32)",
            )
        weak = weak_secret(secret, minimum=FLEET_SECRET_MIN_BYTES)
        if weak is not None:
            raise ConfigError(
                where,
                f"the fleet secret in {what}{line} {weak}; use a random one "
                "(e.g. openssl rand -hex 32)",
            )
    return {
        "fleet_secret": secrets_[0],
        "fleet_secrets_accepted": tuple(secrets_),
        "fleet_secret_from": f"{where}: {name}",
    }


def _membership(data: Any) -> MembershipConfig:
    if not isinstance(data, dict):
        raise ConfigTypeError("membership", f"must be a mapping, got {type(data).__name__}")
    _no_unknown("membership", data, _NOT_DNS_KEYS | _DNS_KEYS | {"source"})
    source = data.get("source", "static")
    if source not in ("static", "etcd", "dns"):
        raise ConfigError(
            "membership.source", f"unknown value {source!r}; expected one of: dns, etcd, static"
        )
    if source == "dns":
        return _dns_membership(data)
    stray = sorted(_DNS_KEYS & data.keys())
    if stray:
        raise ConfigError(f"membership.{stray[0]}", "is only used with source dns")
    members: dict[str, str] = {}
    raw = data.get("members", {})
    if not isinstance(raw, dict):
        raise ConfigTypeError("membership.members", "must be a mapping of member id to address")
    for mid, addr in raw.items():
        check_str("membership.members", mid)
        _address(f"membership.members.{mid}", check_str(f"membership.members.{mid}", addr))
        members[mid] = addr
    endpoints = data.get("endpoints", [])
    if not isinstance(endpoints, list):
        raise ConfigTypeError("membership.endpoints", "must be a list of URLs")
    for i, e in enumerate(endpoints):
        check_str(f"membership.endpoints[{i}]", e)
        if not e.startswith(("http://", "https://")):
            raise ConfigError(f"membership.endpoints[{i}]", f"{e!r} must be an http(s) URL")
    if source == "static" and not members:
        raise ConfigError("membership.members", "is required for source static")
    if source == "etcd" and not endpoints:
        raise ConfigError("membership.endpoints", "is required for source etcd")
    prefix = check_str("membership.prefix", data.get("prefix", "/ratemesh/members/"))
    return MembershipConfig(
        source,
        members,
        tuple(endpoints),
        prefix,
        check_int("membership.lease_ttl_s", data.get("lease_ttl_s", 5), minimum=1, maximum=3600),
        check_int("membership.poll_ms", data.get("poll_ms", 1000), minimum=10),
    )


_DNS_KEYS = {"name", "record", "port", "nameservers", "interval_ms", "epoch_slot_ms"}
_NOT_DNS_KEYS = {"members", "endpoints", "prefix", "lease_ttl_s", "poll_ms"}
_DNS_NAME = re.compile(
    r"^(?=.{1,253}\.?$)([A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.?$"
)


def _dns_membership(data: dict[str, Any]) -> MembershipConfig:
    stray = sorted(_NOT_DNS_KEYS & data.keys())
    if stray:
        raise ConfigError(f"membership.{stray[0]}", "is not used with source dns")
    if data.get("name") is None:
        raise ConfigError("membership.name", "is required for source dns")
    name = check_str("membership.name", data["name"])
    if not _DNS_NAME.match(name):
        raise ConfigError("membership.name", f"{name!r} is not a DNS name")
    record = check_str("membership.record", data.get("record", "a")).lower()
    if record not in ("a", "srv"):
        raise ConfigError("membership.record", f"unknown value {record!r}; expected one of: a, srv")
    port = 0
    if record == "a":
        if data.get("port") is None:
            raise ConfigError("membership.port", "is required for record a (the peers' port)")
        port = check_int("membership.port", data["port"], minimum=1, maximum=65535)
    elif "port" in data:
        raise ConfigError(
            "membership.port", "is only used with record a; SRV records carry their own port"
        )
    servers = data.get("nameservers", [])
    if not isinstance(servers, list):
        raise ConfigTypeError("membership.nameservers", "must be a list of IP[:port]")
    nameservers = tuple(
        _nameserver(f"membership.nameservers[{i}]", s) for i, s in enumerate(servers)
    )
    interval_ms = check_int(
        "membership.interval_ms", data.get("interval_ms", 1000), minimum=10, maximum=3_600_000
    )
    slot_ms = check_int(
        "membership.epoch_slot_ms",
        data.get("epoch_slot_ms", 30_000),
        minimum=1000,
        maximum=86_400_000,
    )
    if slot_ms < 2 * interval_ms:
        raise ConfigError(
            "membership.epoch_slot_ms",
            f"must be at least 2 x interval_ms ({2 * interval_ms}), got {slot_ms}",
        )
    return MembershipConfig(
        "dns",
        name=name,
        record=record,
        port=port,
        nameservers=nameservers,
        interval_ms=interval_ms,
        epoch_slot_ms=slot_ms,
    )


def _nameserver(where: str, value: Any) -> tuple[str, int]:
    """`10.0.0.10`, `10.0.0.10:5353`, `::1` or `[::1]:5353` -> (ip, port)."""
    text = check_str(where, value)
    host, port = text, 53
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(where, f"{text!r} must be an IP address, optionally with :port")
        port_text = rest[1:] if rest else "53"
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        port_text = "53"
    try:
        ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise ConfigError(where, f"{text!r} must be an IP address, optionally with :port") from None
    if not 0 < port < 65536:
        raise ConfigError(where, f"port {port} is out of range")
    return host, port


def _dns_warnings(cfg: NodeConfig, member_id: str) -> list[str]:
    """DNS names the members: a member_id that cannot be such a name owns no keys."""
    m = cfg.membership
    assert m is not None
    out = []
    if m.record == "a":
        try:
            ipaddress.ip_address(member_id)
        except ValueError:
            out.append(
                f"member_id: {member_id!r} is not an address, but A records name "
                "members by address: this member will own no keys (set member_id "
                "to its address, e.g. member_id_env: POD_IP)"
            )
    elif "." not in member_id:
        out.append(
            f"member_id: {member_id!r} is not a host name, but SRV records name "
            "members by target name: this member will own no keys (set member_id "
            "to the name its SRV record targets)"
        )
    if cfg.tls is None and not all(is_loopback(a) for a in (cfg.listen, cfg.advertise) if a):
        out.append(
            f"membership.name: peers come from DNS without tls: whoever can answer "
            f"for {m.name} can join the ring"
        )
    return out


def _policies(data: Any, base: Path | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigTypeError("policies", f"must be a mapping, got {type(data).__name__}")
    _no_unknown("policies", data, {"file", "watch_ms", "inline", "coordinator"})
    out: dict[str, Any] = {}
    found: list[TenantRatePolicy] = []
    if data.get("file") is not None:
        out["policy_file"] = config_file("policies.file", data["file"], base)
        found += load_policy_file(out["policy_file"], where="policies.file")
    if data.get("watch_ms") is not None:
        if "policy_file" not in out:
            raise ConfigError("policies.watch_ms", "is only used with policies.file")
        watch_ms = check_int("policies.watch_ms", data["watch_ms"], maximum=3_600_000)
        if 0 < watch_ms < 10:
            raise ConfigError("policies.watch_ms", f"must be 0 (off) or >= 10, got {watch_ms}")
        out["policy_watch_ms"] = watch_ms
    inline = data.get("inline", [])
    if not isinstance(inline, list):
        raise ConfigTypeError("policies.inline", "must be a list of policies")
    found += [
        TenantRatePolicy.from_dict(
            p, where=f"policies.inline[{i}]", error=ConfigError, written=True
        )
        for i, p in enumerate(inline)
    ]
    out["policies"] = tuple(found)
    coord = data.get("coordinator")
    if coord is not None:
        if not isinstance(coord, dict):
            raise ConfigTypeError("policies.coordinator", "must be a mapping")
        _no_unknown(
            "policies.coordinator",
            coord,
            {"addr", "poll_ttl_ms", "api_key_file", "api_key_env", "ca"},
        )
        if "addr" not in coord:
            raise ConfigError("policies.coordinator.addr", "is required")
        addr = ",".join(
            check_addresses("policies.coordinator.addr", coord["addr"], error=ConfigError)
        )
        out["coordinator"] = CoordinatorConfig(
            addr,
            check_int(
                "policies.coordinator.poll_ttl_ms", coord.get("poll_ttl_ms", 1000), minimum=10
            ),
            _coordinator_key(coord, base),
            None
            if coord.get("ca") is None
            else config_file("policies.coordinator.ca", coord["ca"], base),
        )
    return out


def _coordinator_key(coord: dict[str, Any], base: Path | None) -> str | None:
    file, env = coord.get("api_key_file"), coord.get("api_key_env")
    if file is None and env is None:
        return None
    if file is not None:
        file = str(config_file("policies.coordinator.api_key_file", file, base))
    if env is not None:
        env = check_str("policies.coordinator.api_key_env", env)
    return read_api_key(file=file, env=env, where="policies.coordinator.api_key", error=ConfigError)


def load_policy_file(path: str | Path, *, where: str = "policies") -> list[TenantRatePolicy]:
    """A YAML file holding a list of policies (or a mapping with a `policies:` list); the
    format governord's bootstrap and `mesh policy apply` read too (`ratemesh.policyfile`)."""
    return [d.policy for d in read_policy_file(path, where=where, error=ConfigError)]


def _check_plaintext(cfg: NodeConfig) -> None:
    if cfg.tls is not None or cfg.allow_plaintext:
        return
    addrs = [("listen", cfg.listen), ("advertise", cfg.advertise)]
    if cfg.membership is not None:
        addrs += [(f"membership.members.{k}", v) for k, v in cfg.membership.members.items()]
    for where, addr in addrs:
        if addr and not is_loopback(addr):
            raise ConfigError(
                where,
                f"{addr} is not a loopback address: configure tls, or "
                "set allow_plaintext: true to accept plaintext peers",
            )
