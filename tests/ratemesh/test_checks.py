"""ratemesh.checks: one set of field checks for the mesh, governord and the simulator. Every
refusal names the field and raises the family it is given (its `type_error` for a type)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ratemesh.checks import (
    ADDRESSES_MAX,
    INT_MAX,
    STR_MAX,
    address_parts,
    check_address,
    check_addresses,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_keys,
    check_number,
    check_port,
    check_str,
    is_loopback,
    rename,
    split_address,
    with_default_family,
    with_port,
)
from ratemesh.errors import ConfigError, ConfigTypeError, RatemeshError


class PeerMistake(RatemeshError, ValueError):
    pass


class PeerTypeMistake(PeerMistake, TypeError):
    pass


PeerMistake.type_error = PeerTypeMistake


def test_accepted_values_come_back_unchanged() -> None:
    assert check_int("n", 5, minimum=1, maximum=5) == 5
    assert check_int("n", INT_MAX) == INT_MAX
    assert check_str("s", "x" * STR_MAX) == "x" * STR_MAX
    assert check_bool("b", False) is False
    assert check_choice("c", "a", {"a": 1, "b": 2}) == 1
    assert check_number("x", 0.5, minimum=0, maximum=1) == 0.5
    assert check_float("x", 5) == 5.0 and type(check_float("x", 5)) is float
    assert check_port("p", 65535) == 65535 and check_port("p", 0, allow_zero=True) == 0
    assert check_address("a", "127.0.0.1:1") == "127.0.0.1:1"
    assert check_address("a", "[::1]:7001") == "[::1]:7001"
    assert check_address("a", "host.example:0", allow_zero_port=True) == "host.example:0"
    check_keys("tls", {"cert": 1}, {"cert", "key"})


@pytest.mark.parametrize(
    "call, kind, words",
    [
        (lambda: check_int("f", True), ConfigTypeError, "integer, got bool"),
        (lambda: check_int("f", 1.0), ConfigTypeError, "integer, got float"),
        (lambda: check_int("f", -1), ConfigError, ">= 0, got -1"),
        (lambda: check_int("f", 11, maximum=10), ConfigError, "<= 10, got 11"),
        (lambda: check_str("f", ""), ConfigError, "must not be empty"),
        (lambda: check_str("f", 3), ConfigTypeError, "string, got int"),
        (lambda: check_str("f", "x" * (STR_MAX + 1)), ConfigError, f"at most {STR_MAX}"),
        (lambda: check_bool("f", "yes"), ConfigTypeError, "true or false"),
        (lambda: check_choice("f", "c", {"a": 1, "b": 2}), ConfigError, "one of: a, b"),
        (lambda: check_choice("f", 1, {"a": 1}), ConfigTypeError, "string, got int"),
        (lambda: check_number("f", math.nan), ConfigError, "finite"),
        (lambda: check_number("f", math.inf), ConfigError, "finite"),
        (lambda: check_number("f", -math.inf), ConfigError, "finite"),
        (lambda: check_number("f", True), ConfigTypeError, "number, got bool"),
        (lambda: check_number("f", "5"), ConfigTypeError, "number, got str"),
        (lambda: check_float("f", -5, minimum=0), ConfigError, ">= 0, got -5"),
        (lambda: check_float("f", 7.5, maximum=7), ConfigError, "<= 7, got 7.5"),
        (lambda: check_port("f", 0), ConfigError, ">= 1, got 0"),
        (lambda: check_port("f", 65536), ConfigError, "<= 65535"),
        (lambda: check_port("f", "80"), ConfigTypeError, "integer, got str"),
        (lambda: check_address("f", "127.0.0.1:99999"), ConfigError, "port 99999"),
        (lambda: check_address("f", "127.0.0.1:0"), ConfigError, "port 0"),
        (lambda: check_address("f", "nohost"), ConfigError, "must be host:port"),
        (lambda: check_address("f", ":7001"), ConfigError, "must be host:port"),
        (lambda: check_address("f", "h:-1"), ConfigError, "must be host:port"),
        (lambda: check_address("f", "h:7oo1"), ConfigError, "must be host:port"),
        (lambda: check_address("f", "::1:7001"), ConfigError, "in brackets"),
        (lambda: check_address("f", "[::1]"), ConfigError, "must be host:port"),
        (lambda: check_address("f", 7001), ConfigTypeError, "string, got int"),
    ],
)
def test_refusals_name_the_field_and_say_why(
    call: Any, kind: type[ConfigError], words: str
) -> None:
    with pytest.raises(kind) as info:
        call()
    assert info.value.field == "f" and words in info.value.problem, info.value
    assert str(info.value).startswith("f: ")
    assert isinstance(info.value, ConfigError)  # a type mistake is a config mistake too


def test_unknown_keys_are_named_with_the_allowed_ones() -> None:
    data = {"cert": "c", "kye": "k"}
    with pytest.raises(ConfigError) as info:
        check_keys("tls", data, {"cert", "key"})
    assert info.value.field == "tls.kye"
    assert info.value.problem == "unknown key (a typo?); expected one of: cert, key"
    with pytest.raises(ConfigError) as info:
        check_keys("", {"surprise": 1}, {"listen"})
    assert info.value.field == "surprise"
    assert data == {"cert": "c", "kye": "k"}  # nothing changed


def test_the_family_decides_the_class_raised() -> None:
    with pytest.raises(PeerTypeMistake):
        check_int("f", "1", error=PeerMistake)
    with pytest.raises(PeerMistake) as info:
        check_number("f", math.nan, error=PeerMistake)
    assert not isinstance(info.value, ConfigError)
    bound = with_default_family(check_int, PeerMistake)
    with pytest.raises(PeerTypeMistake):
        bound("f", True)
    with pytest.raises(ConfigError):  # the original keeps its default
        check_int("f", True)
    assert bound("f", 3) == 3 and bound.__name__ == "check_int"
    bound_rename = with_default_family(rename, PeerMistake)
    assert type(bound_rename(ConfigError("a", "b"), "p")) is PeerMistake


def test_rename_rehomes_a_complaint() -> None:
    inner = ConfigTypeError("rate", "must be an integer, got str")
    outer = rename(inner, "policies[2]")
    assert type(outer) is ConfigTypeError and outer.field == "policies[2].rate"
    assert outer.problem == inner.problem and outer.__cause__ is inner
    moved = rename(ConfigError("rate", "x"), "p", PeerMistake)
    assert type(moved) is PeerMistake and moved.field == "p.rate"


def test_addresses_and_loopback() -> None:
    assert split_address("[::1]:7001") == ("::1", 7001)
    assert split_address("a.b:80") == ("a.b", 80)
    assert split_address("a.b") is None and split_address("[::1]x:1") is None
    assert is_loopback("127.0.0.1:1") and is_loopback("127.9.9.9:1")
    assert is_loopback("[::1]:7443") and is_loopback("localhost:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback("10.0.0.1:1")
    assert not is_loopback("example.com:1") and not is_loopback("nonsense")


def test_an_address_list_is_read_one_way() -> None:
    assert check_addresses("g", "a:1") == ("a:1",)
    assert check_addresses("g", " a:1 , [::1]:2") == ("a:1", "[::1]:2")
    assert check_addresses("g", ["a:1", "b:2"]) == ("a:1", "b:2")
    refused = {
        "": ("g", "names no address"),
        "a:1,,b:2": ("g", "has an empty address"),
        "a:1,a:1": ("g", "names a:1 twice"),
        "a:1,::1:2": ("g", "an IPv6 address goes in brackets"),
        ("a:1", "b:0"): ("g[1]", "port 0 is out of range"),
        ("a:1", 2): ("g[1]", "must be host:port, got 2"),
        tuple(f"h{i}:1" for i in range(ADDRESSES_MAX + 1)): ("g", f"at most {ADDRESSES_MAX}"),
    }
    for value, (field, problem) in refused.items():
        with pytest.raises(ConfigError) as err:
            check_addresses("g", value)
        assert err.value.field == field and problem in err.value.problem, err.value
    with pytest.raises(ConfigTypeError):
        check_addresses("g", 7)


def test_host_and_port_come_from_the_one_parser() -> None:
    assert address_parts("x", "[::1]:7001") == ("::1", 7001)
    assert address_parts("x", "0.0.0.0:0", allow_zero_port=True) == ("0.0.0.0", 0)
    with pytest.raises(ConfigError, match="x: 'h:0': port 0"):
        address_parts("x", "h:0")
    assert with_port("0.0.0.0:0", 7001) == "0.0.0.0:7001"
    assert with_port("[::1]:0", 7001) == "[::1]:7001"
    assert with_port("localhost:0", 7001) == "localhost:7001"
