"""The node's public names are pinned: changing them is a decision, not an accident."""

from __future__ import annotations

import mesh.coordinator
import mesh.membership
import mesh.node
import mesh.peer
import mesh.sidecar
import mesh.telemetry


def test_public_names() -> None:
    assert sorted(mesh.node.__all__) == [
        "Mesh",
        "NodeDriver",
        "TransportFactory",
        "new_event_loop",
        "tune_gc",
    ]
    assert sorted(mesh.membership.__all__) == [
        "DnsMembership",
        "EtcdClient",
        "EtcdMembership",
        "MembershipSource",
        "MembershipView",
        "Publish",
        "StaticMembership",
    ]
    assert sorted(mesh.coordinator.__all__) == [
        "PolicyFeed",
        "PolicySnapshot",
        "PolicySource",
        "PolicyStore",
    ]
    assert sorted(mesh.telemetry.__all__) == [
        "DECISIONS_IDLE_S",
        "Detail",
        "ENFORCED_ROWS_MAX",
        "Enforced",
        "MemberAnswer",
        "NodeStats",
        "OTHER",
        "PUBLIC_HEALTH_KEYS",
        "Route",
        "TOP_K",
        "Telemetry",
        "enforced_of",
        "excess_over_times",
        "excess_over_windows",
        "fleet_report",
        "fleet_table",
        "rate_and_burst",
        "telemetry_routes",
    ]
    assert {
        "Transport",
        "MemoryTransport",
        "GrpcTransport",
        "CoordinatorClient",
        "fetch_status",
        "PeerHandler",
    } <= set(mesh.peer.__all__)
    assert sorted(mesh.sidecar.__all__) == [
        "ADMISSION_SERVICE",
        "AUTH_HEADER",
        "Admitter",
        "BearerCheck",
        "DESCRIPTORS_MAX",
        "Decider",
        "EnvoyRls",
        "GrpcSidecar",
        "HttpApp",
        "HttpServer",
        "Item",
        "NAME_MAX_CHARS",
        "Outcome",
        "RLS_SERVICE",
        "Sidecar",
        "encode_outcomes",
        "verdict_fields",
    ]
    mods = (mesh.node, mesh.membership, mesh.coordinator, mesh.telemetry, mesh.peer, mesh.sidecar)
    for mod in mods:
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_mesh_methods() -> None:
    """The embedding API: hot path and its detailed form, the two waiting forms, both
    lifecycles, introspection (a peek that charges nothing among it), and reloading the
    node's policy file."""
    public = sorted(n for n in dir(mesh.node.Mesh) if not n.startswith("_"))
    assert public == [
        "aclose",
        "acquire_slot",
        "admit",
        "admit_blocking",
        "astart",
        "charge",
        "clear_429",
        "egress",
        "health",
        "limited",
        "member_id",
        "metric_declared",
        "peek_numbers",
        "policy_for",
        "policy_known",
        "refund",
        "release_slot",
        "reload_policies",
        "report_429",
        "ring",
        "slot",
        "start",
        "stop",
        "try_admit",
        "try_admit_detailed",
        "try_admit_numbers",
        "try_admit_numbers_many",
    ]
