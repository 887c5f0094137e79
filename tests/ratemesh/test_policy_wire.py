"""The shared policy vocabulary: the policies file, the coordinator's wire shapes and API keys.
A bad file or message is refused naming the field, in the family the caller names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mesh.errors import ConfigError as MeshConfigError
from mesh.errors import MessageError as MeshMessageError
from ratemesh import coordinator as cw
from ratemesh.apikey import read_api_key
from ratemesh.errors import ConfigError, MessageError
from ratemesh.policy import Metric, TenantRatePolicy
from ratemesh.policyfile import POLICIES_PER_FILE_MAX, load_policy_file, parse_policy_list

P: dict[str, Any] = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "target_rate": 100,
    "global_burst": 10,
    "local_burst_cap": 5,
}


def test_a_file_may_leave_generations_out_only_for_apply() -> None:
    (d,) = parse_policy_list([P], where="f", generation_required=False)
    assert not d.explicit and d.policy.generation == 1
    with pytest.raises(ConfigError) as info:
        parse_policy_list([P], where="f")
    assert info.value.field == "f[0].generation"
    two = [dict(P, generation=1), dict(P, generation=2)]
    assert len(parse_policy_list(two, where="f")) == 2  # a node keeps old generations
    with pytest.raises(ConfigError, match="already entry"):
        parse_policy_list(two, where="f", one_per_key=True)
    with pytest.raises(ConfigError, match=f"at most {POLICIES_PER_FILE_MAX}"):
        parse_policy_list([P] * (POLICIES_PER_FILE_MAX + 1), where="f")


def test_a_file_error_is_in_the_callers_family(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("policies: {not: a list}\n")
    with pytest.raises(MeshConfigError, match="must hold a list"):
        load_policy_file(path, where="policies.file", error=MeshConfigError)
    path.write_text("- {tenant_id: acme}\n")
    with pytest.raises(MeshConfigError) as info:
        load_policy_file(path, where="policies.file", error=MeshConfigError)
    assert info.value.field == "policies.file[0].metric"


def test_snapshots_round_trip_and_refuse_bad_messages() -> None:
    policy = TenantRatePolicy.from_dict(dict(P, generation=2))
    snap = cw.PolicySnapshot(7, (policy,), (cw.Tombstone("gone", Metric.WRITE_IOPS, 3),))
    assert cw.PolicySnapshot.from_wire(cw.unpack(cw.pack(snap.to_wire()), "x")) == snap
    assert cw.PolicySnapshot.from_wire({"revision": 0, "policies": []}).removed == ()
    bad: list[tuple[Any, str]] = [
        ({"revision": -1, "policies": []}, "revision"),
        ({"revision": 1, "policies": [dict(P)]}, "policies[0].generation"),
        ({"revision": 1, "policies": [], "removed": [{"tenant_id": "a"}]}, "removed[0].metric"),
        ({"revision": 1, "policies": [{}] * (cw.SNAPSHOT_POLICIES_MAX + 1)}, "policies"),
    ]
    for obj, field in bad:
        with pytest.raises(MeshMessageError) as info:
            cw.PolicySnapshot.from_wire(obj, MeshMessageError)
        assert info.value.field == field
    with pytest.raises(MessageError):
        cw.unpack(b"\xc1", "watch")


def test_history_entries_round_trip() -> None:
    policy = TenantRatePolicy.from_dict(dict(P, generation=1))
    entries = [
        cw.HistoryEntry("acme", Metric.READ_IOPS, 1, 10, policy),
        cw.HistoryEntry("acme", Metric.READ_IOPS, 2, 20, None),
    ]
    wire = {"history": [e.to_wire() for e in entries]}
    assert cw.HistoryEntry.list_from_wire(wire) == entries
    with pytest.raises(MessageError) as info:
        cw.HistoryEntry.list_from_wire({"history": [dict(wire["history"][0], at_ms="x")]})
    assert info.value.field == "history[0].at_ms"


def test_api_keys_come_from_a_file_or_a_variable(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("  the-key  \nsecond line ignored\n")
    assert read_api_key(file=str(tmp_path / "k")) == "the-key"
    assert read_api_key(env="K", environ={"K": "from-env"}) == "from-env"
    (tmp_path / "empty").write_text("\n")
    for kw, field in [
        ({}, "api_key_file"),
        ({"file": str(tmp_path / "none")}, "api_key_file"),
        ({"file": str(tmp_path / "empty")}, "api_key_file"),
        ({"env": "UNSET", "environ": {}}, "api_key_env"),
    ]:
        with pytest.raises(ConfigError) as info:
            read_api_key(**kw)  # type: ignore[arg-type]
        assert info.value.field == field
