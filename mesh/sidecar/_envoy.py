"""Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
(mesh/sidecar/rls/rls.proto), on the sidecar's gRPC port, deciding against the node with the
limits of `envoy_rls.config_files` (mesh/config/_envoy.py; docs/sidecar.md "Envoy and Istio").

Answers as envoyproxy/ratelimit answers: each descriptor's most specific rule (at each entry,
`key_value`, then a `*` pattern, then `key`; a limit applies only at the descriptor's last
entry), `replaces` dropping the limits it names, a descriptor's own `hits_addend` in place of the
request's (0 a check that adds nothing), the request's 0 meaning 1, one status per
descriptor (code, current_limit, limit_remaining, duration_until_reset), OVER_LIMIT overall
if any descriptor is, OK with no current_limit for a descriptor no rule matches, and a
shadow_mode rule's OVER_LIMIT turned into OK (its status otherwise as computed).

The decision itself is ratemesh's: each matched descriptor is one admission of its hits
on its bucket (`mesh.config.bucket_tenant`), all of a call's in one call to the node; a
descriptor of 0 hits is a peek (its remaining, nothing charged: OK, as ratelimit answers a
check that adds nothing to a bucket not already over). A denial for any reason
(rate_limited, or a strict limit's governor being unreachable) is OVER_LIMIT.
`duration_until_reset` is ratelimit's: the rest of the current UTC-aligned window of the
rule's unit. A request's own `limit` override is not applied (the configured rule is).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from mesh.config import EnvoyRlsConfig, RuleLimit, RuleNode, bucket_tenant
from mesh.config._envoy import ENVOY_METRIC, UNIT_S
from mesh.core.verdict import Numbers, Verdict
from mesh.sidecar._items import Admitter
from mesh.sidecar.rls import rls_pb2 as pb

__all__ = ["RLS_SERVICE", "EnvoyRls", "add_rls", "find_limit"]

RLS_SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
ENTRIES_MAX = 64  # entries in one descriptor (Envoy's actions make a handful)
NAME_MAX_CHARS = 1024  # one entry's key or value
_UINT32_MAX = (1 << 32) - 1
_Status = pb.RateLimitResponse.DescriptorStatus
_Code = pb.RateLimitResponse.Code
_UNITS = {
    "second": pb.RateLimitResponse.RateLimit.SECOND,
    "minute": pb.RateLimitResponse.RateLimit.MINUTE,
    "hour": pb.RateLimitResponse.RateLimit.HOUR,
    "day": pb.RateLimitResponse.RateLimit.DAY,
    "week": pb.RateLimitResponse.RateLimit.WEEK,
    "month": pb.RateLimitResponse.RateLimit.MONTH,
    "year": pb.RateLimitResponse.RateLimit.YEAR,
}


def find_limit(root: RuleNode | None, entries: Sequence[tuple[str, str]]) -> RuleLimit | None:
    """The rule a descriptor's entries match, most specific first (module docstring)."""
    if root is None:
        return None
    level, found = root, None
    last = len(entries) - 1
    for i, (key, value) in enumerate(entries):
        final = f"{key}_{value}"
        node = level.children.get(final)
        if node is None:
            for pattern, parts in level.wildcards:
                if _wildcard_match(parts, final):
                    node = level.children[pattern]
                    break
        if node is None:
            node = level.children.get(key)
        if node is not None and node.limit is not None and i == last:
            found = node.limit
        if node is None or not node.children:
            break
        level = node
    return found


def _wildcard_match(parts: tuple[str, ...], value: str) -> bool:
    """Whether `value` matches a pattern split on `*` (each `*` any run of characters)."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last):
        return False
    if len(value) < sum(len(p) for p in parts):
        return False
    rest = value[len(first) : len(value) - len(last)]
    for part in parts[1:-1]:
        at = rest.find(part)
        if at < 0:
            return False
        rest = rest[at + len(part) :]
    return True


def _left(v: Verdict, n: Numbers | None) -> int:
    """A status's `limit_remaining`: the view's remaining units, within a uint32."""
    remaining = v.remaining if n is None else n.remaining
    return max(0, min(remaining or 0, _UINT32_MAX))


class EnvoyRls:
    """ShouldRateLimit against one node; `now_s` is the wall clock ratelimit's windows use."""

    def __init__(
        self,
        config: EnvoyRlsConfig,
        admitter: Admitter,
        *,
        descriptors_max: int,
        now_s: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.admitter = admitter
        self.descriptors_max = descriptors_max
        self.now_s = now_s
        self.calls = 0

    def decide(self, req: pb.RateLimitRequest) -> pb.RateLimitResponse:
        """The answer, or ValueError saying why the request as a whole is refused."""
        self._check(req)
        root = self.config.domains.get(req.domain)
        default_hits = req.hits_addend or 1
        limits: list[RuleLimit | None] = []
        values: list[list[str]] = []
        for d in req.descriptors:
            entries = [(e.key, e.value) for e in d.entries]
            limits.append(find_limit(root, entries))
            values.append([v for _, v in entries])
        replaced = {n for lim in limits if lim is not None for n in lim.replaces}
        limits = [None if lim is not None and lim.name in replaced else lim for lim in limits]
        rows: list[tuple[str, str, int]] = []
        at: list[int] = []
        decided: dict[int, tuple[bool, int]] = {}
        checks: list[tuple[int, str]] = []
        for i, lim in enumerate(limits):
            if lim is None or lim.policy is None:
                continue
            d = req.descriptors[i]
            hits = d.hits_addend.value if d.HasField("hits_addend") else default_hits
            tenant = bucket_tenant(lim, values[i])
            if hits == 0:  # a check that adds nothing: read after the call's charges
                checks.append((i, tenant))
                continue
            at.append(i)
            rows.append((tenant, ENVOY_METRIC, hits))
        verdicts = self.admitter.try_admit_numbers_many(rows) if rows else []
        for i, answer in zip(at, verdicts, strict=True):
            if isinstance(answer, Exception):
                raise ValueError(str(answer))
            decided[i] = (answer[0].allowed, _left(*answer))
        for i, tenant in checks:  # what is left once the call's charges are taken: OK
            decided[i] = (True, _left(*self.admitter.peek_numbers(tenant, ENVOY_METRIC)))
        resp = pb.RateLimitResponse(overall_code=_Code.OK)
        for i, lim in enumerate(limits):
            status = self._status(lim, decided.get(i))
            if status.code == _Code.OVER_LIMIT:
                resp.overall_code = _Code.OVER_LIMIT
            resp.statuses.append(status)
        self.calls += 1
        return resp

    def _status(self, lim: RuleLimit | None, decided: tuple[bool, int] | None) -> _Status:
        if lim is None:
            return _Status(code=_Code.OK)
        if lim.unlimited:
            return _Status(code=_Code.OK, limit_remaining=_UINT32_MAX)
        allowed, remaining = decided if decided is not None else (False, 0)  # 0 per unit
        status = _Status(
            code=_Code.OK if allowed or lim.shadow_mode else _Code.OVER_LIMIT,
            limit_remaining=remaining if allowed else 0,
        )
        status.current_limit.requests_per_unit = lim.requests_per_unit
        status.current_limit.unit = _UNITS[lim.unit]
        status.current_limit.name = lim.name
        unit_s = UNIT_S[lim.unit]
        status.duration_until_reset.seconds = unit_s - int(self.now_s()) % unit_s
        return status

    def _check(self, req: pb.RateLimitRequest) -> None:
        if not req.domain:
            raise ValueError("domain: rate limit domain must not be empty")
        n = len(req.descriptors)
        if n == 0:
            raise ValueError("descriptors: rate limit descriptor list must not be empty")
        if n > self.descriptors_max:
            raise ValueError(f"descriptors: {n} in one call; at most {self.descriptors_max}")
        for i, d in enumerate(req.descriptors):
            if not 0 < len(d.entries) <= ENTRIES_MAX:
                raise ValueError(f"descriptors[{i}].entries: 1 to {ENTRIES_MAX}")
            if d.HasField("hits_addend") and not 0 <= d.hits_addend.value <= _UINT32_MAX:
                raise ValueError(
                    f"descriptors[{i}].hits_addend: at most {_UINT32_MAX}, "
                    f"got {d.hits_addend.value}"
                )
            for j, e in enumerate(d.entries):
                if not e.key or len(e.key) > NAME_MAX_CHARS or len(e.value) > NAME_MAX_CHARS:
                    raise ValueError(
                        f"descriptors[{i}].entries[{j}]: a key of 1 to {NAME_MAX_CHARS} "
                        f"characters and a value of at most {NAME_MAX_CHARS}"
                    )

    async def should_rate_limit(
        self, data: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        try:
            answer = self.decide(pb.RateLimitRequest.FromString(data))
        except DecodeError as exc:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"RateLimitRequest: not a valid message ({exc})"
            )
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        out: bytes = answer.SerializeToString()
        return out


def add_rls(server: aio.Server, rls: EnvoyRls | None) -> dict[str, Callable[[], bool]]:
    """Register ShouldRateLimit on `server` when `envoy_rls` is configured; the services
    added, each with whether it is ready (its rules are loaded at start: always)."""
    if rls is None:
        return {}
    rpc = {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(rls.should_rate_limit)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RLS_SERVICE, rpc),))
    return {RLS_SERVICE: lambda: True}
