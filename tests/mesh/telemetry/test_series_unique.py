"""Every scrape is a valid exposition: no two samples of a family share a label set, and a
tenant with a policy of its own keeps its series while idle instead of folding into
tenant="other" (scraped from a real node's /metrics over HTTP, and from the collector)."""

from __future__ import annotations

from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families

from mesh.core.policy import Mode
from mesh.core.verdict import Reason, Suspension, verdict
from mesh.node import Mesh
from mesh.telemetry import OTHER, NodeStats, Telemetry
from tests.mesh._util import POLICY
from tests.mesh.node.test_telemetry_labels import run


def duplicates(text: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """The (sample name, label set) pairs that appear more than once in an exposition."""
    seen = Counter(
        (s.name, tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    )
    return [k for k, n in seen.items() if n > 1]


def by_tenant(text: str, name: str) -> dict[str, float]:
    """The samples of `name`, by tenant (each tenant has one: one metric in these tests)."""
    return {
        s.labels["tenant"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def test_verdicts_differing_only_by_suspension_are_one_series() -> None:
    # A denial while the owner is unreachable keeps reason=rate_limited and says the
    # suspension: the decision families do not carry it, so both count in one sample.
    plain = verdict(False, Reason.RATE_LIMITED, Mode.GLOBAL, "b1")
    floor = verdict(False, Reason.RATE_LIMITED, Mode.GLOBAL, "b2", Suspension.OWNER_UNREACHABLE)
    stats = NodeStats(enforced={("acme", "read_iops"): 1})
    tel = Telemetry(lambda: stats, top_k=1)
    for n0 in (1, 2):  # the first scrape labels acme, from 0 (its past stays in "other")
        for tenant in ("acme", "zed"):  # zed folds into "other"
            for v, n in ((plain, 3), (floor, 4)):
                tel.verdicts[id(v)] = v
                tel.decisions[(tenant, "read_iops", id(v))] = n * n0
        text = tel.render().decode()
    assert duplicates(text) == []
    assert by_tenant(text, "ratemesh_denied_total") == {"acme": 7, OTHER: 21}
    assert 'ratemesh_suspended_verdicts_total{metric="read_iops",mode="global",' in text


def test_a_tenant_with_its_own_policy_keeps_its_series_while_idle() -> None:
    ok = verdict(True, Reason.ADMITTED, Mode.GLOBAL, "b")
    stats = NodeStats(enforced={("acme", "read_iops"): 1, ("*", "read_iops"): 1})
    tel = Telemetry(lambda: stats, top_k=5)
    tel.verdicts[id(ok)] = ok
    tel.decisions[("acme", "read_iops", id(ok))] = 5
    tel.decisions[("drifter", "read_iops", id(ok))] = 2  # served under "*"
    tel.render()  # both labelled from here on
    tel.decisions[("acme", "read_iops", id(ok))] = 10
    tel.decisions[("drifter", "read_iops", id(ok))] = 4
    tel.render()
    tel.forget_idle()
    tel.forget_idle()  # idle for a whole period: both forgotten
    assert tel.decisions == {}
    for _ in range(3):  # and it stays: scrapes later still show its own series
        admitted = by_tenant(tel.render().decode(), "ratemesh_admitted_total")
        # acme keeps its 5; drifter (no policy of its own) folded: "other" has its 4 and
        # what acme had before it was labelled (5)
        assert admitted == {"acme": 5, OTHER: 9}
    tel.decisions[("acme", "read_iops", id(ok))] = 1  # back: counts on from 5
    text = tel.render().decode()
    assert (
        'ratemesh_admitted_total{metric="read_iops",mode="global",reason="admitted",'
        'tenant="acme"} 6.0'
    ) in text


def test_a_real_node_scrape_has_no_duplicate_label_sets() -> None:
    async def body(mesh: Mesh) -> None:
        for tenant in ("acme", "t1", "t2", "nobody"):
            for metric in ("read_iops", "write_iops", "typo_metric"):
                for _ in range(30):
                    mesh.try_admit(tenant, metric)
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(f"http://{mesh.telemetry_address}/metrics")
        assert r.status_code == 200
        assert duplicates(r.text) == []
        assert "ratemesh_build_info{" in r.text and "process_cpu_seconds_total" in r.text

    policies = [
        dict(POLICY, target_rate=10, global_burst=10, local_burst_cap=2),
        dict(POLICY, tenant_id="*", metric="write_iops", mode="local", target_rate=5),
    ]
    cfg = {
        "member_id": "a",
        "telemetry_top_k": 1,
        "telemetry_listen": "127.0.0.1:0",
        "policies": {"inline": policies},
    }
    run(cfg, body)
