"""The node config's `envoy_rls:` section: envoyproxy/ratelimit's own rule files, read
unchanged, served as `envoy.service.ratelimit.v3.RateLimitService` on the sidecar's gRPC
port (mesh/sidecar/_envoy.py, docs/sidecar.md "Envoy and Istio")::

    envoy_rls:
      config_files: [ratelimit/config.yaml]   # relative to this config's directory
      mode: global                            # how the limits are metered (default global)

A rule file is `domain:` and nested `descriptors:` (key, optional value, `rate_limit:
{unit, requests_per_unit}` or `{unlimited: true}`, `shadow_mode`, `name`, `replaces`,
`descriptors:`), as envoyproxy/ratelimit validates them: the same keys, the same refusals.
`detailed_metric`, `value_to_metric` and `metadata` are accepted and change nothing here
(they name ratelimit's statsd series); `quota_mode` and `share_threshold` are refused.

Each descriptor with a rate_limit is one ratemesh policy, named the way ratelimit names its
stats key: tenant `envoy:<domain>.<key>_<value>.<key>...` (`_<value>` only where the rule
gives one), metric `envoy_requests`, rate requests_per_unit per unit (ratelimit's lengths:
a week is 7 days, a month 30, a year 365), burst one unit's worth. As in ratelimit, every
distinct list of request values gets its own bucket under it: the policy is declared for descriptor
`v: "*"` and a request's bucket is `v=<its values>` (`bucket_tenant`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from mesh.config._files import config_file
from mesh.core._validate import check_str
from mesh.core.policy import Mode, TenantRatePolicy
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.checks import check_keys
from ratemesh.policy import DESCRIPTOR_VALUE_MAX, descriptor_tenant
from ratemesh.yamlfile import load_yaml

__all__ = [
    "ENVOY_METRIC",
    "ENVOY_TENANT_PREFIX",
    "RULES_MAX",
    "UNIT_S",
    "EnvoyRlsConfig",
    "RuleLimit",
    "RuleNode",
    "bucket_tenant",
    "parse_envoy_rls",
]

ENVOY_METRIC = "envoy_requests"
ENVOY_TENANT_PREFIX = "envoy:"
BUCKET_KEY = "v"  # the descriptor key a request's values are folded under
RULES_MAX = 10_000  # descriptors across all files: each limit is a policy the node holds
FILES_MAX = 256
UNIT_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400}
UNIT_S |= {"week": 7 * 86_400, "month": 30 * 86_400, "year": 365 * 86_400}  # ratelimit's
REQUESTS_PER_UNIT_MAX = (1 << 32) - 1  # uint32 on the wire
_ROOT_KEYS = {"domain", "descriptors"}
_KEYS = {
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
}
_LIMIT_KEYS = {"unit", "requests_per_unit", "unlimited", "name", "replaces"}


@dataclass(frozen=True, slots=True)
class RuleLimit:
    """One descriptor's rate_limit. `policy` is None when nothing is metered (unlimited, or
    0 requests per unit: every request over the limit, as ratelimit answers it)."""

    tenant: str  # the policy's tenant: ENVOY_TENANT_PREFIX + ratelimit's stats key
    unit: str  # second .. year; "" when unlimited
    requests_per_unit: int
    unlimited: bool = False
    shadow_mode: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()
    policy: TenantRatePolicy | None = None


@dataclass(frozen=True, slots=True)
class RuleNode:
    """A level of a domain's descriptor tree: children by `key_value` or `key` (ratelimit's
    composite key), and the patterns among them holding `*` (split on it, in file order)."""

    children: dict[str, RuleNode] = field(default_factory=dict)
    limit: RuleLimit | None = None
    wildcards: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class EnvoyRlsConfig:
    config_files: tuple[str, ...] = ()
    mode: Mode = Mode.GLOBAL
    domains: dict[str, RuleNode] = field(default_factory=dict)

    def policies(self) -> tuple[TenantRatePolicy, ...]:
        """Every metered limit's policy, in file order."""
        out: list[TenantRatePolicy] = []
        for root in self.domains.values():
            _collect(root, out)
        return tuple(out)


def _collect(node: RuleNode, out: list[TenantRatePolicy]) -> None:
    for child in node.children.values():
        if child.limit is not None and child.limit.policy is not None:
            out.append(child.limit.policy)
        _collect(child, out)


def bucket_tenant(limit: RuleLimit, values: list[str]) -> str:
    """The RateKey tenant a request's values are metered under for `limit`: its own bucket
    per distinct list of values, as ratelimit's cache key is. Readable values
    (`v=10.0.0.1`, `v=a,b`) when they fit a descriptor value unambiguously, else a digest."""
    text = ",".join(values)
    if (
        text
        and len(text) <= DESCRIPTOR_VALUE_MAX
        and text.isprintable()
        and not text.startswith("#")
        and all("," not in v and v for v in values)
    ):
        shown = text
    else:
        h = hashlib.blake2b(digest_size=16)
        for v in values:
            data = v.encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "big") + data)
        shown = "#" + h.hexdigest()
    return descriptor_tenant(limit.tenant, (BUCKET_KEY, shown))


def parse_envoy_rls(data: Any, base: Path | None) -> EnvoyRlsConfig:
    if not isinstance(data, dict):
        raise ConfigTypeError("envoy_rls", f"must be a mapping, got {type(data).__name__}")
    check_keys("envoy_rls", data, {"config_files", "mode"}, error=ConfigError)
    files = data.get("config_files")
    if not isinstance(files, list) or not files:
        raise ConfigTypeError("envoy_rls.config_files", "must be a non-empty list of files")
    if len(files) > FILES_MAX:
        raise ConfigError("envoy_rls.config_files", f"at most {FILES_MAX} files")
    mode = Mode.GLOBAL
    if "mode" in data:
        text = check_str("envoy_rls.mode", data["mode"])
        try:
            mode = Mode(text)
        except ValueError:
            choices = ", ".join(m.value for m in Mode)
            raise ConfigError("envoy_rls.mode", f"{text!r} is not one of {choices}") from None
    paths = tuple(config_file(f"envoy_rls.config_files[{i}]", f, base) for i, f in enumerate(files))
    loader = _Loader(mode)
    for i, path in enumerate(paths):
        loader.load_file(f"envoy_rls.config_files[{i}]", path)
    return EnvoyRlsConfig(paths, mode, loader.domains)


class _Loader:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.domains: dict[str, RuleNode] = {}
        self.rules = 0

    def load_file(self, where: str, path: str) -> None:
        doc = load_yaml(Path(path), field=where, error=ConfigError)
        self.where = f"{where} ({path})"
        if not isinstance(doc, dict):
            self._fail("", f"must be a mapping with domain and descriptors, got {_kind(doc)}")
        self._keys("", doc, _ROOT_KEYS)
        domain = doc.get("domain")
        if not isinstance(domain, str) or not domain:
            self._fail("domain", "config file cannot have empty domain")
        if domain in self.domains:
            self._fail("domain", f"duplicate domain '{domain}' in config file")
        self.domains[domain] = self._level(domain, "descriptors", doc.get("descriptors"))

    def _fail(self, entry: str, why: str) -> NoReturn:
        raise ConfigError(self.where + (f": {entry}" if entry else ""), why)

    def _keys(self, entry: str, doc: dict[Any, Any], known: set[str]) -> None:
        for k in doc:
            if not isinstance(k, str):
                self._fail(entry, f"config error, key is not of type string: {k}")
            if k not in known:
                self._fail(entry, f"config error, unknown key '{k}'")

    def _level(self, parent: str, entry: str, items: Any) -> RuleNode:
        """One level of descriptors; `parent` is the stats key so far."""
        if items is None:
            return RuleNode()
        if not isinstance(items, list):
            self._fail(entry, f"must be a list of descriptors, got {_kind(items)}")
        children: dict[str, RuleNode] = {}
        wildcards: list[tuple[str, tuple[str, ...]]] = []
        for i, d in enumerate(items):
            at = f"{entry}[{i}]"
            if not isinstance(d, dict):
                self._fail(at, f"config error, yaml file contains list of type other than map: {d}")
            self._keys(at, d, _KEYS)
            # a number is its text, as ratelimit's YAML decoder reads it into a string
            key, value = (_scalar(d.get(k, "")) for k in ("key", "value"))
            if not isinstance(key, str) or not key:
                self._fail(at, "descriptor has empty key")
            if not isinstance(value, str):
                self._fail(f"{at}.value", f"must be a string, got {_kind(value)}")
            final = f"{key}_{value}" if value else key
            full = f"{parent}.{final}"
            if final in children:
                self._fail(at, f"duplicate descriptor composite key '{full}'")
            for flag in ("quota_mode", "share_threshold"):
                if d.get(flag):
                    self._fail(f"{at}.{flag}", "is not supported by ratemesh's RLS")
            self.rules += 1
            if self.rules > RULES_MAX:
                self._fail(at, f"more than {RULES_MAX} descriptors in all (RULES_MAX)")
            limit = None
            if d.get("rate_limit") is not None:
                limit = self._limit(f"{at}.rate_limit", full, d["rate_limit"], d)
            below = self._level(full, f"{at}.descriptors", d.get("descriptors"))
            children[final] = RuleNode(below.children, limit, below.wildcards)
            if "*" in final:
                wildcards.append((final, tuple(final.split("*"))))
        return RuleNode(children, None, tuple(wildcards))

    def _limit(self, at: str, full: str, rl: Any, d: dict[str, Any]) -> RuleLimit:
        if not isinstance(rl, dict):
            self._fail(at, f"must be a mapping, got {_kind(rl)}")
        self._keys(at, rl, _LIMIT_KEYS)
        unlimited = _flag(self, f"{at}.unlimited", rl.get("unlimited", False))
        shadow = _flag(self, at.rpartition(".")[0] + ".shadow_mode", d.get("shadow_mode", False))
        unit = rl.get("unit", "")
        unit = unit.lower() if isinstance(unit, str) else unit
        valid = unit in UNIT_S
        if unlimited and valid:
            self._fail(at, "should not specify rate limit unit when unlimited")
        if not unlimited and not valid:
            self._fail(f"{at}.unit", f"invalid rate limit unit '{rl.get('unit', '')}'")
        rpu = rl.get("requests_per_unit", 0)
        if type(rpu) is not int or not 0 <= rpu <= REQUESTS_PER_UNIT_MAX:
            self._fail(f"{at}.requests_per_unit", f"must be an integer 0..2^32-1, got {rpu!r}")
        name = rl.get("name", "")
        if not isinstance(name, str):
            self._fail(f"{at}.name", f"must be a string, got {_kind(name)}")
        replaces = rl.get("replaces") or []
        if not isinstance(replaces, list):
            self._fail(f"{at}.replaces", "must be a list of {name: ...}")
        names: list[str] = []
        for r in replaces:
            n = r.get("name") if isinstance(r, dict) else None
            if not isinstance(n, str) or not n:
                self._fail(f"{at}.replaces", "should not have an empty replaces entry")
            if n == name:
                self._fail(f"{at}.replaces", "replaces should not contain name of same descriptor")
            names.append(n)
        tenant = ENVOY_TENANT_PREFIX + full
        policy = None
        if not unlimited and rpu > 0:
            try:
                policy = TenantRatePolicy(
                    tenant_id=tenant,
                    descriptor=(BUCKET_KEY, "*"),
                    metric=ENVOY_METRIC,
                    generation=1,
                    target_rate=f"{rpu}/{UNIT_S[unit]}s",  # type: ignore[arg-type]  # text
                    global_burst=rpu,
                    local_burst_cap=rpu,
                    mode=self.mode,
                )
            except ConfigError as exc:
                self._fail(at, str(exc))
        return RuleLimit(
            tenant, "" if unlimited else unit, rpu, unlimited, shadow, name, tuple(names), policy
        )


def _flag(loader: _Loader, at: str, value: Any) -> bool:
    if type(value) is not bool:
        loader._fail(at, f"must be true or false, got {_kind(value)}")
    return bool(value)


def _scalar(value: Any) -> Any:
    return str(value) if type(value) in (int, float) else value


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
