"""envoyproxy/ratelimit's own tests, replayed against ratemesh: its rule files (vendored in
tests/mesh/sidecar/envoy/, README there) load or are refused with its messages, descriptors
match the rules its config test expects, and its integration test's ShouldRateLimit
sequence gets the answers it expects from a real node's sidecar gRPC port on loopback."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from mesh.config import parse_config
from mesh.errors import ConfigError
from mesh.sidecar._envoy import find_limit
from mesh.sidecar.rls import rls_pb2 as pb
from tests.mesh.sidecar._envoy import envoy_config, request, rls_call
from tests.mesh.sidecar._node import insecure, node

OK, OVER = pb.RateLimitResponse.OK, pb.RateLimitResponse.OVER_LIMIT
Unit = pb.RateLimitResponse.RateLimit


def status(code: int, rpu: int, unit: int, remaining: int) -> tuple[int, int, int, int]:
    return (code, rpu, unit, remaining)


def seen(resp: pb.RateLimitResponse) -> list[tuple[int, int, int, int]]:
    return [
        (s.code, s.current_limit.requests_per_unit, s.current_limit.unit, s.limit_remaining)
        for s in resp.statuses
    ]


def test_the_integration_sequence_answers_as_ratelimit_does() -> None:
    """integration_test.go, testBasicBaseConfig (the redis-free parts: every hit counted)."""

    async def main() -> None:
        async with node(envoy_config("basic.yaml", "another.yaml")) as m:
            async with insecure(m.sidecar_addresses["grpc"]) as ch:
                call = rls_call(ch)
                resp = await call(request("foo", [("hello", "world")], hits=1))
                assert resp.overall_code == OK and seen(resp) == [(OK, 0, 0, 0)]
                assert not resp.statuses[0].HasField("current_limit")

                resp = await call(request("basic", [("key1", "foo")], hits=1))
                assert resp.overall_code == OK
                assert seen(resp) == [status(OK, 50, Unit.SECOND, 49)]
                assert 0 < resp.statuses[0].duration_until_reset.seconds <= 1

                value = str(random.getrandbits(62))
                for i in range(25):
                    resp = await call(request("another", [("key2", value)], hits=1))
                    code, left = (OVER, 0) if i >= 20 else (OK, 20 - (i + 1))
                    assert resp.overall_code == code, i
                    assert seen(resp) == [status(code, 20, Unit.MINUTE, left)], i

                value = str(random.getrandbits(62))
                for i in range(15):
                    resp = await call(request("another", [("key2", value)], [("key3", value)]))
                    code, left2 = (OVER, 0) if i >= 10 else (OK, 10 - (i + 1))
                    assert resp.overall_code == code, i
                    assert seen(resp) == [
                        status(OK, 20, Unit.MINUTE, 20 - (i + 1)),
                        status(code, 10, Unit.HOUR, left2),
                    ], i

                first = await call(request("another", [("key4", "durTest")], hits=1))
                await asyncio.sleep(1.1)
                second = await call(request("another", [("key4", "durTest")], hits=1))
                assert (
                    second.statuses[0].duration_until_reset.seconds
                    < first.statuses[0].duration_until_reset.seconds
                )

    asyncio.run(main())


def _limit(file: str, domain: str, *entries: tuple[str, str]) -> Any:
    cfg = parse_config(envoy_config(file))
    assert cfg.envoy_rls is not None
    return find_limit(cfg.envoy_rls.domains.get(domain), list(entries))


def test_descriptors_match_the_rules_config_test_expects() -> None:
    """config_test.go, TestBasicConfig and the wildcard cases: the most specific rule."""
    f = "basic_config.yaml"
    assert _limit(f, "foo_domain", ("key1", "value1")) is None
    assert _limit(f, "test-domain", ("key1", "something")) is None
    assert _limit(f, "test-domain", ("key1", "value1")) is None  # no limit at level one
    assert _limit(f, "test-domain", ("key1", "value1"), ("subkey1", "x")).requests_per_unit == 5
    got = _limit(f, "test-domain", ("key1", "value1"), ("subkey1", "subvalue1"))
    assert (got.requests_per_unit, got.unit) == (10, "second")
    assert _limit(f, "test-domain", ("key2", "x")).requests_per_unit == 20
    assert _limit(f, "test-domain", ("key2", "value2")).requests_per_unit == 30
    assert _limit(f, "test-domain", ("key2", "value3")) is None  # a value with no limit
    assert _limit(f, "test-domain", ("key2", "x"), ("key3", "y")) is None  # deeper than rules
    assert (_limit(f, "test-domain", ("key3", "x")).unit) == "hour"
    key4 = _limit(f, "test-domain", ("key4", "x"))
    assert (key4.name, key4.unit, key4.requests_per_unit) == ("key4_rate_limit", "day", 1)
    assert _limit(f, "test-domain", ("key6", "x")).unlimited
    assert _limit(f, "test-domain", ("key7", "x")).requests_per_unit == 70
    assert (
        _limit(f, "test-domain", ("key5", "value5"), ("subkey5", "subvalue5")).requests_per_unit
        == 25
    )
    assert _limit(f, "test-domain", ("key1", "value1")) is None
    assert _limit(f, "test-domain", ("key1", "value1"), ("subkey1", "subvalue1")).tenant == (
        "envoy:test-domain.key1_value1.subkey1_subvalue1"
    )
    w = "wildcard.yaml"
    assert _limit(w, "test-domain", ("wild", "foo1")).requests_per_unit == 20
    assert _limit(w, "test-domain", ("wild", "bar")) is None
    assert _limit(w, "test-domain", ("noWild", "foo1")) is None
    assert _limit(w, "test-domain", ("noVal", "anything")).requests_per_unit == 20
    assert _limit(w, "test-domain", ("midWild", "barxyzb")).requests_per_unit == 20
    assert _limit(w, "test-domain", ("midWild", "barxyzc")) is None
    assert _limit(w, "test-domain", ("multiWild", "foo1bar2baz")).requests_per_unit == 10
    assert _limit(w, "test-domain", ("multiWild", "foobaz")) is None
    assert (
        _limit(w, "test-domain", ("nestedWild", "val1"), ("wild", "goo2")).requests_per_unit == 20
    )


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["empty_domain.yaml"], "config file cannot have empty domain"),
        (
            ["basic_config.yaml", "duplicate_domain.yaml"],
            "duplicate domain 'test-domain' in config file",
        ),
        (["empty_key.yaml"], "descriptor has empty key"),
        (["duplicate_key.yaml"], "duplicate descriptor composite key 'test-domain.key1_value1'"),
        (["bad_limit_unit.yaml"], "invalid rate limit unit 'foo'"),
        (["replaces_self.yaml"], "replaces should not contain name of same descriptor"),
        (["replaces_empty.yaml"], "should not have an empty replaces entry"),
        (["bad_yaml.yaml"], ""),
        (["misspelled_key.yaml"], "config error, unknown key 'ratelimit'"),
        (["misspelled_key2.yaml"], "config error, unknown key 'requestsperunit'"),
        (["non_string_key.yaml"], "config error, key is not of type string: 0.25"),
        (["non_map_list.yaml"], "config error, yaml file contains list of type other than map: a"),
        (["unlimited_with_unit.yaml"], "should not specify rate limit unit when unlimited"),
    ],
)
def test_bad_rule_files_are_one_error_naming_the_file(files: list[str], message: str) -> None:
    """config_test.go's refusals, with its messages, as one ConfigError naming the file."""
    with pytest.raises(ConfigError) as info:
        parse_config(envoy_config(*files))
    text = str(info.value)
    assert files[-1] in text and message in text
    assert "Traceback" not in text


def test_shadow_mode_answers_ok_with_the_computed_status() -> None:
    """config_test.go's shadowmode_config.yaml, sent past its limits: a shadow rule's
    OVER_LIMIT is OK (its remaining 0), a rule without it is OVER_LIMIT."""

    async def main() -> None:
        async with node(envoy_config("shadowmode_config.yaml")) as m:
            async with insecure(m.sidecar_addresses["grpc"]) as ch:
                call = rls_call(ch)
                for i in range(22):
                    resp = await call(request("test-domain", [("key2", "x")]))
                    assert resp.overall_code == OK
                    left = max(0, 20 - (i + 1))
                    assert seen(resp) == [status(OK, 20, Unit.MINUTE, left)], i
                for i in range(31):
                    resp = await call(request("test-domain", [("key2", "value2")]))
                    assert resp.overall_code == (OVER if i >= 30 else OK), i
                resp = await call(request("test-domain", [("key2", "value2")], hits=5))
                assert resp.overall_code == OVER

    asyncio.run(main())


def test_a_week_and_a_descriptors_own_hits_answer_as_ratelimit_does(tmp_path: Any) -> None:
    """ratelimit's later additions: the unit `week` (7 days), and a descriptor's own
    `hits_addend` (utils.GetHitsAddends), which takes the place of the request's and may be
    0: a check that charges nothing."""
    rules = tmp_path / "week.yaml"
    rules.write_text(
        "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, requests_per_unit: 3}\n"
    )

    def ask(*hits: int | None, request_hits: int = 0) -> pb.RateLimitRequest:
        req = request("w", *([("k", "v")] for _ in hits), hits=request_hits)
        for d, h in zip(req.descriptors, hits, strict=True):
            if h is not None:
                d.hits_addend.value = h
        return req

    async def main() -> None:
        async with node(envoy_config(str(rules))) as m:
            async with insecure(m.sidecar_addresses["grpc"]) as ch:
                call = rls_call(ch)
                resp = await call(ask(0))
                assert resp.overall_code == OK and seen(resp) == [status(OK, 3, Unit.WEEK, 3)]
                assert 0 < resp.statuses[0].duration_until_reset.seconds <= 7 * 86_400
                resp = await call(ask(2, request_hits=1))  # the descriptor's 2, not the 1
                assert seen(resp) == [status(OK, 3, Unit.WEEK, 1)]
                resp = await call(ask(0))  # a check: what is left, nothing charged
                assert seen(resp) == [status(OK, 3, Unit.WEEK, 1)]
                resp = await call(ask(2))
                assert resp.overall_code == OVER
                assert seen(resp) == [status(OVER, 3, Unit.WEEK, 0)]
                resp = await call(ask(None, 0, request_hits=1))  # the request's 1, and a check
                assert resp.overall_code == OK
                assert seen(resp) == [status(OK, 3, Unit.WEEK, 0)] * 2

    asyncio.run(main())
