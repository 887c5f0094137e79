"""governord's address in a node's config: one host:port, a YAML list, or a
comma-separated string naming a leader and its standbys; every mistake is a ConfigError
naming the field (or the list's entry). The SDK (`Dial`), the coordinator client and the
config read a list with the one parser, `ratemesh.checks.check_addresses`, so they agree."""

from __future__ import annotations

from typing import Any

import pytest

from governor.client._rpc import Dial
from mesh.config import parse_config
from mesh.errors import ConfigError
from mesh.peer import CoordinatorClient
from ratemesh.checks import ADDRESSES_MAX, check_addresses
from ratemesh.errors import ConfigError as SharedConfigError


def _coordinator(addr: Any) -> dict[str, Any]:
    return {"policies": {"coordinator": {"addr": addr}}}


def _strict(addr: Any) -> dict[str, Any]:
    return {"strict": {"governord": addr, "api_key_env": "TENANT_KEY"}}


@pytest.mark.parametrize(
    "addr",
    ["a:7443,b:7443", " a:7443 , b:7443", ["a:7443", "b:7443"], ("a:7443", "b:7443")],
)
def test_a_list_or_a_comma_separated_string(addr: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANT_KEY", "k")
    coordinator = parse_config(_coordinator(addr)).coordinator
    assert coordinator is not None and coordinator.addr == "a:7443,b:7443"
    strict = parse_config(_strict(addr)).strict
    assert strict is not None and strict.governord == "a:7443,b:7443"
    assert parse_config(_strict("a:7443")).strict.governord == "a:7443"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "addr, where",
    [
        ("", ""),
        ([], ""),
        ("a:7443,,b:7443", ""),
        ("a:7443,nowhere", ""),
        (["a:7443", "nowhere"], "[1]"),
        (["a:7443", 7443], "[1]"),
        (["a:7443", "a:7443"], "[1]"),
        ("a:7443,a:7443", ""),
        (7443, ""),
        ({"a": 1}, ""),
        ([f"h{i}:1" for i in range(ADDRESSES_MAX + 1)], ""),
    ],
)
def test_mistakes_name_the_field(addr: Any, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANT_KEY", "k")
    for data, field in (
        (_coordinator(addr), "policies.coordinator.addr"),
        (_strict(addr), "strict.governord"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config(data)
        assert err.value.field == field + where, err.value
    with pytest.raises(ConfigError) as err:
        check_addresses("x", addr, error=ConfigError)
    assert err.value.field == "x" + where
    with pytest.raises(ConfigError) as err:
        CoordinatorClient(addr)
    assert err.value.field == "addr" + where
    with pytest.raises(SharedConfigError) as shared:  # the SDK: the same refusal
        Dial(addr, "key")
    assert shared.value.field == "addr" + where, shared.value


def test_each_names_what_was_wrong() -> None:
    cases = {
        "a:1,a:1": "addr: names a:1 twice",
        "a:1,,b:2": "addr: 'a:1,,b:2' has an empty address",
        "a:1,b": "addr: 'b' must be host:port",
        "a:1,[::1]:0": "addr: '[::1]:0': port 0 is out of range 1..65535",
    }
    for addr, message in cases.items():
        with pytest.raises(SharedConfigError, match=message.replace("[", r"\[")):
            Dial(addr, "key")
    assert Dial("[::1]:7443, b:1", "key").addrs == ("[::1]:7443", "b:1")
