"""The `strict:` section of a node's config: where strict limits get their credit.

    strict:
      governord: 127.0.0.1:7443   # required: governord's session API; several governords
                                  # on one record (a leader and its standbys): a list, or
                                  # comma-separated "a:7443,b:7443"; calls follow the leader
      api_key_file: tenant.key    # or api_key_env: NAME (exactly one): a tenant's API key
      ca: ca.pem                  # verify governord's TLS certificate (turns TLS on)
      node: 12                    # the quota node strict limits spend from (default: the
                                  # key's tenant node, the session's scope)
      nodes: {acme: 14}           # per mesh tenant, overriding `node`
      session_ttl_ms: 10000       # governord session TTL (a restart shorter than 80 % of it
                                  # keeps the session)
      credit: {rho_ppm: 1000, epsilon_ms: 50, horizon_ms: 1000, idle_ms: 2000}
                                  # (lead_ms unset: derived; docs/strict.md)

A strict policy for (tenant, metric) spends at governord node `nodes[tenant]` (else `node`,
else the key's tenant node) with the metric's name as the resource, e.g. `read_iops`: that
node's `rates: {read_iops: {per_s, burst}}` is the strict bound (docs/strict.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mesh.config._files import config_file
from mesh.core._validate import check_int, check_str
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.apikey import read_api_key
from ratemesh.checks import check_addresses, check_keys
from ratemesh.credit import CreditConfig
from ratemesh.creditsize import (
    ROUND_TRIP_ASSUMED_MS,
    UTILISATION_TARGET,
    burst_needed,
    drained_wait_base_ms,
    utilisation_bound,
    wait_for_target_ms,
)
from ratemesh.errors import ConfigError as SharedConfigError
from ratemesh.policy import Mode, TenantRatePolicy

__all__ = ["StrictConfig", "parse_strict", "strict_findings"]

NODES_MAX = 10_000  # per-tenant node overrides in one config
SESSION_TTL_MS = 10_000
_KEYS = {"governord", "api_key_file", "api_key_env", "ca", "node", "nodes", "session_ttl_ms"}
_CREDIT_KEYS = {f.name for f in fields(CreditConfig)}
DEFAULT_CREDIT = CreditConfig()


@dataclass(frozen=True, slots=True)
class StrictConfig:
    governord: str  # host:port, or several comma-separated (a leader and its standbys)
    api_key: str = field(repr=False)
    ca: str | None = None
    node: int | None = None  # None: the API key's tenant node
    nodes: dict[str, int] = field(default_factory=dict)
    session_ttl_ms: int = SESSION_TTL_MS
    credit: CreditConfig = field(default_factory=CreditConfig)

    def node_for(self, tenant: str) -> int | None:
        """The governord node a tenant's strict limits spend from (None: the key's own)."""
        return self.nodes.get(tenant, self.node)


def parse_strict(data: Any, base: Path | None) -> StrictConfig:
    """Validate the section; every mistake is a ConfigError naming `strict.<key>`."""
    if not isinstance(data, dict):
        raise ConfigTypeError("strict", f"must be a mapping, got {type(data).__name__}")
    check_keys("strict", data, _KEYS | {"credit"}, error=ConfigError)
    if "governord" not in data:
        raise ConfigError("strict.governord", "is required (governord's address, host:port)")
    addr = ",".join(check_addresses("strict.governord", data["governord"], error=ConfigError))
    file, env = data.get("api_key_file"), data.get("api_key_env")
    if file is None and env is None:
        raise ConfigError("strict.api_key_file", "is required (or api_key_env): a tenant's key")
    if file is not None:
        file = config_file("strict.api_key_file", file, base)
    if env is not None:
        env = check_str("strict.api_key_env", env)
    key = read_api_key(file=file, env=env, where="strict.api_key", error=ConfigError)
    ca = None if data.get("ca") is None else config_file("strict.ca", data["ca"], base)
    node = None
    if data.get("node") is not None:
        node = check_int("strict.node", data["node"], minimum=1)
    return StrictConfig(
        addr,
        key,
        ca,
        node,
        _nodes(data.get("nodes")),
        check_int(
            "strict.session_ttl_ms",
            data.get("session_ttl_ms", SESSION_TTL_MS),
            minimum=100,
            maximum=3_600_000,
        ),
        _credit(data.get("credit")),
    )


def _nodes(raw: Any) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigTypeError("strict.nodes", "must be a mapping of tenant id to node id")
    if len(raw) > NODES_MAX:
        raise ConfigError("strict.nodes", f"holds {len(raw)} tenants; at most {NODES_MAX}")
    out = {}
    for tenant, node in raw.items():
        check_str("strict.nodes", tenant)
        out[tenant] = check_int(f"strict.nodes.{tenant}", node, minimum=1)
    return out


def _credit(raw: Any) -> CreditConfig:
    if raw is None:
        return CreditConfig()
    if not isinstance(raw, dict):
        raise ConfigTypeError("strict.credit", f"must be a mapping, got {type(raw).__name__}")
    check_keys("strict.credit", raw, _CREDIT_KEYS, error=ConfigError)
    try:
        return CreditConfig(**raw)
    except SharedConfigError as exc:
        raise ConfigError(f"strict.credit.{exc.field}", exc.problem) from exc


def strict_findings(strict: StrictConfig | None, policies: Sequence[TenantRatePolicy]) -> list[str]:
    """Why a strict policy cannot be served at 0.9 of its rate under overload, one line per
    finding, with the setting that would (`mesh validate`'s warnings). The policy's rate
    and burst stand for governord's rate on its node, which the node's config does not
    hold; the round trip to governord is taken as ROUND_TRIP_ASSUMED_MS. The estimate is
    `ratemesh.creditsize.utilisation_bound`, the formulas the holder sizes by."""
    if strict is None:
        return []
    cfg = strict.credit
    out = []
    trip = ROUND_TRIP_ASSUMED_MS
    for p in policies:
        if p.mode is not Mode.STRICT or not p.target_rate or not p.global_burst:
            continue
        rate, burst = p.target_rate, p.global_burst
        wait = drained_wait_base_ms(cfg.lead_ms, rate, burst)
        share = cfg.burst_share_ppm
        bound = utilisation_bound(rate, burst, round_trip_ms=trip, wait_ms=wait, share_ppm=share)
        if bound >= UTILISATION_TARGET:
            continue
        name = f"policy {p.tenant_id}/{p.metric}"
        span = burst * 1000 // rate
        serves = f"serves about {bound:.2f} of R under overload (B/R {span} ms"
        if cfg.lead_ms is not None and wait > wait_for_target_ms(
            rate, burst, round_trip_ms=trip, share_ppm=share
        ):
            best = wait_for_target_ms(rate, burst, round_trip_ms=trip, share_ppm=share)
            fix = "remove lead_ms (derived from R, B and the round trip)"
            if best >= 1:
                fix += f" or set it <= {best}"
            out.append(
                f"strict.credit.lead_ms: {name} {serves}): a drained worker waits about "
                f"lead_ms ({cfg.lead_ms} ms) while its bucket refills; {fix}"
            )
            continue
        # in units, as the policy's burst is written (rate and burst are sub-units here)
        need = -(-burst_needed(rate, round_trip_ms=trip, share_ppm=share) // p.scale)
        if share > DEFAULT_CREDIT.burst_share_ppm:
            out.append(
                f"strict.credit.burst_share_ppm: {name} {serves}): one worker's block of "
                f"{share} ppm of B leaves the bucket little room to refill; remove it "
                f"(default {DEFAULT_CREDIT.burst_share_ppm})"
            )
            continue
        out.append(
            f"{name}: B/R of {span} ms is shorter than a block's round trip to governord "
            f"(about {trip} ms) can serve: about {bound:.2f} of R under overload; a burst "
            f"of at least {need} would"
        )
    return out
