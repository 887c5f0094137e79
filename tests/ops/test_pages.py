"""The /ui pages without a browser: self-contained (no external asset, no CDN), served by
the node's telemetry routes, and the per-limit numbers /health gains: this member's
decisions and the excess estimate and bound that /metrics exports."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.node import Mesh
from mesh.peer import MemoryNetwork, MemoryTransport
from mesh.telemetry import telemetry_routes
from mesh.telemetry._routes import SERVED_SHOWN_MAX
from ratemesh.ui import governord_page, node_page
from tests.mesh._util import POLICY


@pytest.mark.parametrize("page", [node_page(), governord_page()])
def test_a_page_is_one_self_contained_document(page: bytes) -> None:
    html = page.decode()
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert not re.search(r"\b(src|href)\s*=|<link|@import|https?://|//cdn", html, re.I)
    assert "innerHTML" not in html  # values are written as text, never as markup
    assert html.count("<script>") == 1


def test_health_carries_each_limits_decisions_and_excess_as_metrics_counts_them() -> None:
    async def main() -> None:
        cfg = {"member_id": "a", "policies": {"inline": [POLICY]}}
        net = MemoryNetwork()
        async with Mesh(cfg, transport=lambda mid, e, h: MemoryTransport(net, mid, h.deliver)) as m:
            for _ in range(150):  # acme's burst is 100
                m.try_admit("acme", "read_iops")
            tel = m._require().telemetry
            routes = telemetry_routes(tel, m.health)
            code, ctype, body = routes["/ui"]()
            assert (code, ctype) == (200, "text/html; charset=utf-8") and body == node_page()
            code, ctype, body = routes["/health"]()
            (acme,) = json.loads(body)["limits"]
            samples = {
                s.name: s.value
                for fam in text_string_to_metric_families(tel.render().decode())
                for s in fam.samples
                if s.labels.get("tenant") == "acme"
            }
            assert acme["admitted"] > 0 and acme["denied"] > 0  # its local burst, then denials
            assert acme["admitted"] + acme["denied"] == 150
            for _ in range(3):  # reading them changes nothing a scrape sees
                routes["/health"]()
            assert samples == {
                s.name: s.value
                for fam in text_string_to_metric_families(tel.render().decode())
                for s in fam.samples
                if s.labels.get("tenant") == "acme"
            }
            assert acme["excess_estimate"] == samples["ratemesh_excess_estimate"]
            assert acme["excess_bound"] == samples["ratemesh_excess_bound"]

    asyncio.run(main())


def test_health_counts_do_not_go_down_while_a_limit_is_active_and_restart_once_idle() -> None:
    async def main() -> None:
        cfg = {"member_id": "a", "policies": {"inline": [POLICY]}}
        net = MemoryNetwork()
        async with Mesh(cfg, transport=lambda mid, e, h: MemoryTransport(net, mid, h.deliver)) as m:
            tel = m._require().telemetry
            health = telemetry_routes(tel, m.health)["/health"]

            def counts() -> tuple[int, int]:
                (acme,) = json.loads(health()[2])["limits"]
                return acme["admitted"], acme["denied"]

            for _ in range(150):
                m.try_admit("acme", "read_iops")
            tel.forget_idle()  # remembers the counts
            m.try_admit("acme", "read_iops")  # a denial: the admitted count is now idle
            tel.forget_idle()  # drops the unchanged admitted count; the denials are live
            admitted, denied = counts()
            assert admitted > 0 and admitted + denied == 151
            tel.forget_idle()
            tel.forget_idle()  # nothing changed for a whole period: idle, forgotten
            assert counts() == (0, 0)

    asyncio.run(main())


def test_health_lists_tenants_served_under_a_default_policy_bounded() -> None:
    async def main() -> None:
        default = dict(POLICY, tenant_id="*", mode="local", target_rate=100, global_burst=5)
        cfg = {"member_id": "a", "policies": {"inline": [POLICY, default]}}
        net = MemoryNetwork()
        async with Mesh(cfg, transport=lambda mid, e, h: MemoryTransport(net, mid, h.deliver)) as m:
            tel = m._require().telemetry
            health = telemetry_routes(tel, m.health)["/health"]
            for i in range(SERVED_SHOWN_MAX + 5):
                for _ in range(1 + (i == 7) * 10):  # t007 is denied: listed first
                    m.try_admit(f"t{i:03d}", "read_iops")
            m.try_admit("acme", "read_iops")  # a policy by name: its own row in "limits"
            m.try_admit("nobody", "write_iops")  # no policy at all: never "served"
            doc = json.loads(health()[2])
            served = doc["served"]
            assert len(served) == SERVED_SHOWN_MAX and doc["served_omitted"] == 5
            assert served[0]["tenant"] == "t007" and served[0]["denied"] > 0
            assert {x["policy"] for x in served} == {"*"}
            assert {x["mode"] for x in served} == {"local"}
            names = {x["tenant"] for x in served}
            assert "acme" not in names and "nobody" not in names

    asyncio.run(main())
