"""The spend quotas' PostgreSQL cell tier against the real server on 127.0.0.1:5432 (under
CI=true a missing server fails, never skips): max per cell, the server-clock beat and its
retention, the per-key bound, hashed keys, forgetting a member by name, and psycopg errors
translated at the adapter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from mesh.config import PostgresConfig, parse_config
from mesh.core.policy import RateKey
from mesh.errors import ConfigError, PeerUnavailable
from mesh.node._build import build_cell_tier
from mesh.sharedstate import PostgresCellTier
from mesh.sharedstate._cells import cell_key
from tests.mesh.sharedstate._postgres import DSN_ENV, pg_schema

K = RateKey("tenant-secret", "spend", 1)


@pytest.fixture
def target() -> Iterator[tuple[str, str]]:
    with pg_schema() as t:
        yield t


def _tier(
    target: tuple[str, str], *, retention_ms: int = 600_000, cells_max: int = 1024
) -> PostgresCellTier:
    dsn, schema = target
    return PostgresCellTier(
        PostgresConfig(dsn, DSN_ENV, schema),
        deadline_ms=2000,
        retention_ms=retention_ms,
        cells_max=cells_max,
    )


def test_a_cell_is_max_of_old_and_new_so_retries_never_double_count(
    target: tuple[str, str],
) -> None:
    tier = _tier(target)
    try:
        assert tier.exchange(0, K, 7, "a", 10) == {"a": 10}
        assert tier.exchange(0, K, 7, "a", 10) == {"a": 10}  # a retried flush
        assert tier.exchange(0, K, 7, "a", 3) == {"a": 10}  # an older value, late
        assert tier.exchange(0, K, 7, "b", 5) == {"a": 10, "b": 5}
        assert tier.exchange(0, K, 8, "a", 1) == {"a": 1}  # the next period: its own key
        big = (1 << 63) - 1
        assert tier.exchange(0, K, 9, "a", big) == {"a": big}  # exact, no float
        assert tier.connects == 1
    finally:
        tier.close()


def test_keys_are_hashed_and_a_departed_cell_ages_out_on_the_server_clock(
    target: tuple[str, str],
) -> None:
    dsn, schema = target
    tier = _tier(target, retention_ms=200)
    try:
        tier.exchange(0, K, 7, "gone", 40)
        assert tier.exchange(0, K, 7, "live", 1) == {"gone": 40, "live": 1}
        with psycopg.connect(dsn) as pg:
            keys = pg.execute(
                sql.SQL("SELECT DISTINCT key FROM {}.quota_cells").format(sql.Identifier(schema))
            ).fetchall()
        assert keys == [(cell_key(K, 7),)] and "tenant-secret" not in keys[0][0]
        time.sleep(0.3)  # past the retention on the server's own clock
        assert tier.exchange(0, K, 7, "live", 2) == {"live": 2}
    finally:
        tier.close()


def test_a_key_holds_at_most_cells_max_and_a_known_member_still_writes(
    target: tuple[str, str],
) -> None:
    tier = _tier(target, cells_max=2)
    try:
        tier.exchange(0, K, 7, "a", 1)
        tier.exchange(0, K, 7, "b", 1)
        assert tier.exchange(0, K, 7, "c", 9) == {"a": 1, "b": 1}  # refused, not evicting
        assert tier.exchange(0, K, 7, "a", 5) == {"a": 5, "b": 1}
    finally:
        tier.close()


def test_forget_member_purges_its_cells_in_every_key(target: tuple[str, str]) -> None:
    tier = _tier(target)
    try:
        tier.exchange(0, K, 7, "old", 30)
        tier.exchange(0, RateKey("t2", "spend", 1), 7, "old", 4)
        assert tier.exchange(0, K, 7, "new", 30) == {"new": 30, "old": 30}  # counted twice
        assert tier.forget_member("old") == 2
        assert tier.exchange(0, K, 7, "new", 30) == {"new": 30}
        assert tier.forget_member("old") == 0
    finally:
        tier.close()


def test_an_unreachable_server_is_a_peer_error_naming_the_tier_without_the_dsn() -> None:
    secret = "pw-not-to-print"
    dsn = f"host=127.0.0.1 port=1 dbname=test user=x password={secret}"
    tier = PostgresCellTier(PostgresConfig(dsn, DSN_ENV), deadline_ms=250)
    with pytest.raises(PeerUnavailable) as info:
        tier.exchange(0, K, 7, "a", 1)
    text = str(info.value)
    assert text.startswith("shared_state.postgres: exchange:") and secret not in text
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


def test_the_node_builds_it_from_config_with_consent(
    target: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, schema = target
    monkeypatch.setenv(DSN_ENV, dsn)
    section = {"external": "allow", "dsn_env": DSN_ENV, "schema": schema}
    cfg = parse_config({"shared_state": {"postgres": section}})
    assert cfg.shared_state.postgres is not None
    assert "network PostgreSQL" in " ".join(cfg.warnings())
    tier = build_cell_tier(cfg)
    assert isinstance(tier, PostgresCellTier) and tier.connects == 0  # lazy: nothing dialled
    try:
        assert tier.exchange(0, K, 7, "a", 3) == {"a": 3}
    finally:
        tier.close()


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"dsn_env": DSN_ENV}, "shared_state.postgres.external"),
        ({"external": "yes", "dsn_env": DSN_ENV}, "shared_state.postgres.external"),
        ({"external": "allow"}, "shared_state.postgres.dsn_env"),
        ({"external": "allow", "dsn_env": "RATEMESH_UNSET_DSN"}, "shared_state.postgres.dsn_env"),
        (
            {"external": "allow", "dsn_env": DSN_ENV, "schema": "Bad-Name"},
            "shared_state.postgres.schema",
        ),
        ({"external": "allow", "dsn_env": DSN_ENV, "addr": "x:1"}, "shared_state.postgres"),
    ],
)
def test_consent_and_config_mistakes_are_one_line_errors_naming_the_field(
    section: dict[str, str], field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, "host=127.0.0.1 dbname=test")
    with pytest.raises(ConfigError) as info:
        parse_config({"shared_state": {"postgres": section}})
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


def test_one_tier_not_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_ENV, "host=127.0.0.1 dbname=test")
    both = {
        "redis": {"external": "allow", "addr": "127.0.0.1:6379"},
        "postgres": {"external": "allow", "dsn_env": DSN_ENV},
    }
    with pytest.raises(ConfigError, match="^shared_state.postgres: name one shared-state tier"):
        parse_config({"shared_state": both})
