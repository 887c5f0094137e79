"""The open vocabulary in the cores: a metric name any policy declares works end
to end through a fleet; a peer's metric name is untrusted (bounded length and charset) and a
bad one is refused with a MessageError naming the field; admission grows a view map per
declared metric only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest

from mesh.core.admission import UNKNOWN, Admission
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import (
    RateSnapshot,
    ReportBatch,
    SnapshotBatch,
    UsageReport,
    decode,
    encode,
    to_wire,
)
from mesh.core.policy import Mode, PolicyCache, RateKey, TenantRatePolicy, Unit
from mesh.core.verdict import Reason
from mesh.errors import ConfigError, MessageError
from mesh.testing.fleet import MemoryFleet, Offered, drive
from ratemesh.policy import descriptor_tenant

REQ = TenantRatePolicy("acme", "requests", 1, 1000, 100, 10)
TOK = TenantRatePolicy.from_dict(
    {
        "tenant_id": "acme",
        "metric": "tokens",
        "generation": 1,
        "target_rate": "60k/minute",
        "global_burst": "8k",
        "local_burst_cap": "1k",
        "unit": "tokens",
    }
)
UP = TenantRatePolicy("acme", "requests", 1, 100, 20, 5, descriptor=("route", "/upload"))


def test_a_declared_name_round_trips_the_wire() -> None:
    keys = (REQ.rate_key, TOK.rate_key, UP.rate_key)
    batch = ReportBatch.of("w1", 3, [UsageReport(k, "w1", 1, 1, iops_delta=2) for k in keys])
    back = decode(encode(batch))
    assert isinstance(back, ReportBatch) and back.keys == keys
    assert all(type(k.metric) is str for k in back.keys)
    snaps = SnapshotBatch.of("o1", 3, [RateSnapshot(TOK.rate_key, 1, 1, 5, 10, 1, 1)])
    got = decode(encode(snaps))
    assert isinstance(got, SnapshotBatch) and got.keys == (TOK.rate_key,)


@pytest.mark.parametrize(
    "metric",
    [
        "Requests",
        "requests; drop",
        "x" * 64,
        "x" * 1_000_000,  # a megabyte: refused on its length, not echoed back whole
        "",
        "é",
        "a\x00b",
        7,
        None,
        ["requests"],
    ],
)
def test_a_hostile_metric_name_from_a_peer_is_refused(metric: Any) -> None:
    for wire in (_reports_wire(metric), _snapshots_wire(metric)):
        with pytest.raises(MessageError) as info:
            decode(msgpack.packb(wire, use_bin_type=True))
        assert info.value.field == "keys[0].metric", info.value
        assert len(str(info.value)) < 300


def _reports_wire(metric: Any) -> list[Any]:
    wire = to_wire(ReportBatch.of("w1", 3, [UsageReport(REQ.rate_key, "w1", 1, 1, 1)]))
    wire[5] = [["acme", metric, 1]]
    return wire


def _snapshots_wire(metric: Any) -> list[Any]:
    wire = to_wire(SnapshotBatch.of("o1", 3, [RateSnapshot(REQ.rate_key, 1, 1, 5, 10, 1, 1)]))
    wire[6] = [["acme", metric, 1]]
    return wire


def test_requests_and_tokens_end_to_end_through_a_two_member_fleet() -> None:
    f = MemoryFleet(["w0", "w1"], PolicyCache([REQ, TOK]), seed=3)
    f.run_until(NS_PER_S // 5)  # owners past their conservative start
    demand = [Offered("acme", 3000, metric="requests"), Offered("acme", 3000, metric="tokens")]
    drive(f, demand, f.now_ns + NS_PER_S)
    envelope = {  # N*b + R*d, plus the ideal's own burst that the fleet started without
        "requests": 2 * 10 + 1000 * f.propagation_delay_ns() / NS_PER_S,
        "tokens": 2 * 1000 + 1000 * f.propagation_delay_ns() / NS_PER_S,
    }
    for d in demand:  # both offered three times R = 1000/s for a second
        assert d.admitted >= 800, (d.metric, d.report())
        assert d.max_excess <= envelope[d.metric], (d.metric, d.report())
    owner = f.members[f.ring.owner_of(TOK.rate_key)].owner
    assert TOK.rate_key in owner.applied  # the owner metered the open name's key


def local(p: TenantRatePolicy) -> TenantRatePolicy:
    return replace(p, mode=Mode.LOCAL)


def test_admission_grows_a_view_map_per_declared_metric_only() -> None:
    a = Admission(PolicyCache([local(REQ), local(TOK)]), 0)
    assert a.try_admit("acme", "requests").allowed
    assert a.try_admit("acme", "tokens", 500).allowed
    assert a.try_admit("acme", "gpu_seconds") is UNKNOWN  # a valid name with no policy
    assert a.try_admit("mallory", "requests").reason is Reason.POLICY_UNKNOWN
    assert sorted(a._gates) == ["requests", "tokens"]
    with pytest.raises(ConfigError) as info:
        a.try_admit("acme", "Bad Name")
    assert info.value.field == "metric"
    a.refund("acme", "tokens", 200)  # a short charge given back
    assert a.gate("acme", "tokens") is not None and TOK.unit is Unit.TOKENS


def test_a_descriptor_is_its_own_key_and_falls_back_to_the_tenant() -> None:
    a = Admission(PolicyCache([local(REQ), local(UP)]), 0)
    upload = descriptor_tenant("acme", ("route", "/upload"))
    # The upload route's own bucket (burst 20, local mode, no time passing)...
    assert sum(a.try_admit(upload, "requests").allowed for _ in range(100)) == 20
    assert a.try_admit("acme", "requests").allowed  # ...apart from the tenant's
    gate = a.gate(upload, "requests")
    assert gate is not None and gate.policy.rate_key == RateKey(upload, "requests", 1)
    search = descriptor_tenant("acme", ("route", "/search"))
    assert a.try_admit(search, "requests").allowed  # no policy of its own: the tenant's
    fallback = a.gate(search, "requests")
    assert fallback is not None and fallback.policy.rate_key == REQ.rate_key
    # ...and the same view as the tenant's: one bucket, one refund path.
    assert fallback is a.gate("acme", "requests")
    before = fallback.avail
    assert a.try_admit(search, "requests").allowed and fallback.avail == before - 1
    a.refund(search, "requests", 1)
    assert fallback.avail == before
    assert a.gate_count == 2  # the upload route's view and the tenant's; none for /search
