"""How a single verdict reads over HTTP beyond its JSON body: the status of a denial (200 as
before, or 429 Too Many Requests when the node or the request asks), `Retry-After` on a 429,
and the IETF httpapi `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-
ratelimit-headers, the version of its repository's main branch):

    RateLimit-Policy: "read_iops";q=100;w=60;ratemesh-burst=20
    RateLimit: "read_iops";r=42;t=5

The policy item is named by the metric (never the tenant: the field may reach the caller's
own clients). `q` and `w` are the limit as a whole amount per whole period of seconds
(`ratemesh.rates.rate_window`: "100/day" is q=100;w=86400), the GCRA's burst a vendor
parameter; `r` is `remaining`, and `t` the seconds, rounded up, until the amount asked fits
(a denial, the same moment as `Retry-After`, as the draft asks: never earlier) or until the
bucket is full (an admission). Each is left out when its number is unknown; a metric whose
unit the draft's registry cannot name (tokens, usd_micros) gets neither field.
"""

from __future__ import annotations

from typing import Any

from ratemesh.policy import TenantRatePolicy, Unit

__all__ = ["DENY_STATUS_HEADER", "SF_INTEGER_MAX", "deny_status", "ratelimit_fields"]

DENY_STATUS_HEADER = b"x-ratemesh-deny-status"  # a request's own choice: "429" or "200"
SF_INTEGER_MAX = 999_999_999_999_999  # a Structured Field Integer has at most 15 digits
# the draft's quota units by ours: requests is its default (no `qu`)
_QUOTA_UNITS = {Unit.REQUESTS: "", Unit.BYTES: ';qu="content-bytes"'}


def deny_status(header: bytes | None, default: int) -> int | str:
    """The status of a denial: the request's `x-ratemesh-deny-status` if it sent one, else
    the node's `sidecar.http_status_on_deny`; a value other than 200 or 429 is why not."""
    if header is None:
        return default
    if header in (b"200", b"429"):
        return int(header)
    shown = header[:20].decode("ascii", "replace")
    return f"{DENY_STATUS_HEADER.decode()}: must be 200 or 429, got {shown!r}"


def ratelimit_fields(
    metric: str, policy: TenantRatePolicy, fields: dict[str, Any]
) -> list[tuple[bytes, bytes]]:
    """`RateLimit-Policy` and `RateLimit` for one verdict's wire `fields` (with its
    `limit_fields`), where the numbers are known."""
    window = fields.get("window")
    unit = _QUOTA_UNITS.get(policy.unit)
    if window is None or unit is None:
        return []
    q, w = window["amount"], window["period_s"]
    if q > SF_INTEGER_MAX or w > SF_INTEGER_MAX:
        return []
    name = f'"{metric}"'  # METRIC_NAME: nothing to escape in an sf-string
    burst = min(fields["burst"], SF_INTEGER_MAX)
    out = [(b"ratelimit-policy", f"{name};q={q}{unit};w={w};ratemesh-burst={burst}".encode())]
    remaining = fields.get("remaining")
    if remaining is None:
        return out
    wait_ms = fields.get("reset_after_ms" if fields["allowed"] else "retry_after_ms")
    reset = "" if wait_ms is None else f";t={min(ceil_s(wait_ms), SF_INTEGER_MAX)}"
    out.append((b"ratelimit", f"{name};r={min(remaining, SF_INTEGER_MAX)}{reset}".encode()))
    return out


def ceil_s(ms: int) -> int:
    """Whole seconds, rounded up: a client that waits this long has waited long enough."""
    return -(-ms // 1000)
