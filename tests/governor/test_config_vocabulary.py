"""governord's config speaks the shared vocabulary: its ConfigError is a
ratemesh.errors.ConfigError, its numbers are checked like the mesh's (finite, ranged, no
bools), ports are 1..65535, and its file is read by ratemesh's load_yaml. Each refusal names
the field or the file, and changes nothing."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

import ratemesh.errors
from governor.config import ConfigError, ConfigTypeError, load_config, parse_config
from governor.store import open_backend

DIGEST = hashlib.sha256(b"k").hexdigest()
TENANT = {"api_key_sha256": DIGEST}
ADAPTIVE = {"initial_limit": 5, "min_limit": 1, "max_limit": 9, "target_p95_ms": 100}


def _refused(doc: dict[str, Any], field: str) -> ConfigError:
    before = copy.deepcopy(doc)
    with pytest.raises(ConfigError) as info:
        parse_config(doc, env={})
    err = info.value
    assert err.field == field and err.key == field, err
    assert str(err).startswith(f"{field}: ") and "\n" not in str(err)
    assert isinstance(err, ratemesh.errors.ConfigError)
    assert doc == before  # nothing changed
    return err


@pytest.mark.parametrize("value", [-5, -0.001, float("nan"), float("inf"), 3601, True, "5"])
def test_drain_s_must_be_finite_seconds_in_range(value: object) -> None:
    _refused({"drain_s": value}, "drain_s")


def test_drain_s_accepts_seconds() -> None:
    assert parse_config({"drain_s": 0}, env={}).drain_s == 0.0
    assert parse_config({"drain_s": 2.5}, env={}).drain_s == 2.5
    assert parse_config({}, env={}).drain_s == 5.0


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"snapshot_every": True}, "snapshot_every"),
        ({"snapshot_every": 0}, "snapshot_every"),
        ({"snapshot_every": 1.5}, "snapshot_every"),
        ({"session": {"ttl_ms": True}}, "session.ttl_ms"),
        ({"session": {"min_ttl_ms": float("nan")}}, "session.min_ttl_ms"),
        ({"session": {"max_ttl_ms": 10**12}}, "session.max_ttl_ms"),
        ({"root": {"quotas": {"http": True}}}, "root.quotas.http"),
        ({"root": {"limits": {"db": 2.5}}}, "root.limits.db"),
        ({"tenants": {"a": {**TENANT, "weight": True}}}, "tenants.a.weight"),
        ({"tenants": {"a": {**TENANT, "defaults": {"priority": 2**31}}}},
         "tenants.a.defaults.priority"),
        ({"tenants": {"a": {**TENANT, "defaults": {"priority": False}}}},
         "tenants.a.defaults.priority"),
        ({"adaptive": {"db": {**ADAPTIVE, "max_overload_permille": 1001}}},
         "adaptive.db.max_overload_permille"),
        ({"adaptive": {"db": {**ADAPTIVE, "target_p95_ms": float("inf")}}},
         "adaptive.db.target_p95_ms"),
        ({"allow_plaintext": "yes"}, "allow_plaintext"),
    ],
)  # fmt: skip
def test_every_number_is_checked_like_the_mesh(doc: dict[str, Any], field: str) -> None:
    _refused(doc, field)


def test_type_mistakes_are_config_type_errors() -> None:
    err = _refused({"drain_s": True}, "drain_s")
    assert isinstance(err, ConfigTypeError) and isinstance(err, ratemesh.errors.ConfigTypeError)
    _refused({"tenants": {"a": {**TENANT, "weight": "3"}}}, "tenants.a.weight")


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"listen": "127.0.0.1:99999"}, "listen[0]"),
        ({"listen": "127.0.0.1:0"}, "listen[0]"),
        ({"listen": ["127.0.0.1:7443", "127.0.0.1:65536"]}, "listen[1]"),
        ({"listen": "::1:7443"}, "listen[0]"),
        ({"metrics": "127.0.0.1:0"}, "metrics"),
        ({"metrics": "127.0.0.1:70000"}, "metrics"),
    ],
)
def test_ports_are_1_to_65535(doc: dict[str, Any], field: str) -> None:
    # governord binds exactly the ports it is given and prints them; no test binds port 0
    _refused(doc, field)


def test_ports_at_the_edges_and_ipv6_are_fine() -> None:
    cfg = parse_config({"listen": ["127.0.0.1:1", "[::1]:65535"], "metrics": "[::1]:9"}, env={})
    assert cfg.listen == ("127.0.0.1:1", "[::1]:65535") and cfg.metrics == "[::1]:9"


def test_unknown_keys_name_the_allowed_ones() -> None:
    err = _refused({"session": {"ttl": 5}}, "session.ttl")
    assert "expected one of: max_ttl_ms, min_ttl_ms, ttl_ms" in err.problem


def _file_refused(path: Path, *words: str) -> None:
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert str(path) in str(info.value) and "\n" not in str(info.value), info.value
    for w in words:
        assert w in str(info.value), info.value
    if before is not None:
        assert path.read_bytes() == before


def test_a_file_is_read_by_the_shared_loader(tmp_path: Path) -> None:
    p = tmp_path / "g.yaml"
    p.write_text("[" * 5000 + "]" * 5000)  # was a RecursionError traceback
    _file_refused(p, "deeper than 64 levels")
    p.write_bytes(b"store: sqlite:caf\xe9.db\n")
    _file_refused(p, "not UTF-8", "offset 17")
    p.write_text("listen: [127.0.0.1:1\n")
    _file_refused(p, "not valid YAML", "line 2")
    _file_refused(tmp_path / "missing.yaml", "no such file")
    _file_refused(tmp_path, "is a directory")


@pytest.mark.parametrize("text, field", [("drain_s: .nan\n", "drain_s"),
                                         ("drain_s: -5\n", "drain_s"),
                                         ("drain_s: true\n", "drain_s"),
                                         ("listen: 127.0.0.1:99999\n", "listen[0]")])  # fmt: skip
def test_the_issue_cases_from_a_file(tmp_path: Path, text: str, field: str) -> None:
    p = tmp_path / "g.yaml"
    p.write_text(text)
    with pytest.raises(ratemesh.errors.ConfigError) as info:
        load_config(str(p), env={})
    assert info.value.field == field
    assert p.read_text() == text


def test_a_good_file_still_loads(tmp_path: Path) -> None:
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"listen": "127.0.0.1:7443", "drain_s": 0.5,
                                 "snapshot_every": 50_000, "tenants": {"a": TENANT}}))  # fmt: skip
    cfg = load_config(str(p), env={})
    assert cfg.drain_s == 0.5 and cfg.snapshot_every == 50_000 and cfg.tenants[0].name == "a"


def test_open_backend_names_store_for_an_unknown_kind() -> None:
    with pytest.raises(ratemesh.errors.ConfigError) as info:
        open_backend("mysql", "x")
    assert info.value.field == "store" and "mysql" in info.value.problem
