"""The spend quotas' Redis cell tier against the real Redis on 127.0.0.1:6379 (under
CI=true a missing Redis fails, never skips): max per field, the server-clock beat and its
retention, hashed keys, and the ledger taking remote = max(owner fold, tier fold)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from mesh.core.messages import CellFold, FoldRow
from mesh.core.policy import RateKey, TenantRatePolicy
from mesh.core.quota import QuotaLedger, period_index
from mesh.sharedstate import RedisCellTier
from mesh.sharedstate._cells import cell_key
from ratemesh.policy import Period
from tests.mesh._redis import connect


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = connect()
    yield c
    c.close()


K = RateKey("tenant-secret", "spend", 1)


@pytest.fixture
def tier(client: redis.Redis) -> Iterator[RedisCellTier]:
    prefix = f"test:cells:{uuid.uuid4().hex}:"
    yield RedisCellTier(client, prefix=prefix)
    for k in client.scan_iter(match=prefix + "*"):
        client.delete(k)


def test_a_field_is_max_of_old_and_new_so_retries_never_double_count(
    tier: RedisCellTier,
) -> None:
    assert tier.exchange(0, K, 7, "a", 10) == {"a": 10}
    assert tier.exchange(0, K, 7, "a", 10) == {"a": 10}  # a retried flush
    assert tier.exchange(0, K, 7, "a", 3) == {"a": 10}  # an older value, late
    assert tier.exchange(0, K, 7, "b", 5) == {"a": 10, "b": 5}
    assert tier.exchange(0, K, 8, "a", 1) == {"a": 1}  # the next period: its own hash


def test_burns_past_lua_doubles_stay_exact(tier: RedisCellTier) -> None:
    big = (1 << 62) + 1
    assert tier.exchange(0, K, 7, "a", big) == {"a": big}
    assert tier.exchange(0, K, 7, "a", big - 1) == {"a": big}


def test_the_key_hashes_the_scope_and_carries_a_ttl(
    tier: RedisCellTier, client: redis.Redis
) -> None:
    tier.exchange(0, K, 7, "a", 1)
    keys = [k.decode() for k in client.scan_iter(match=tier.prefix + "*")]
    assert keys == [cell_key(K, 7, tier.prefix)]
    assert "tenant-secret" not in keys[0]
    assert client.pttl(keys[0]) > 0


def test_a_departed_workers_field_ages_out_on_the_server_clock(client: redis.Redis) -> None:
    prefix = f"test:cells:{uuid.uuid4().hex}:"
    short = RedisCellTier(client, prefix=prefix, retention_ms=200)
    try:
        short.exchange(0, K, 7, "gone", 40)
        assert short.exchange(0, K, 7, "live", 1) == {"gone": 40, "live": 1}
        time.sleep(0.3)  # past the retention on Redis's own clock
        assert short.exchange(0, K, 7, "live", 2) == {"live": 2}
        assert client.hkeys(cell_key(K, 7, prefix)) == [b"live"]  # deleted, not hidden
    finally:
        client.delete(cell_key(K, 7, prefix))


def test_a_field_with_no_beat_is_kept_never_aged(client: redis.Redis) -> None:
    prefix = f"test:cells:{uuid.uuid4().hex}:"
    short = RedisCellTier(client, prefix=prefix, retention_ms=1)
    key = cell_key(K, 7, prefix)
    try:
        client.hset(key, "old-binary", "9")
        time.sleep(0.01)
        assert short.exchange(0, K, 7, "a", 1) == {"a": 1, "old-binary": 9}
    finally:
        client.delete(key)


def test_the_ledger_takes_the_larger_of_the_owner_and_tier_folds(tier: RedisCellTier) -> None:
    now = 1_774_958_400_000
    p = TenantRatePolicy.from_dict(
        {
            "tenant_id": K.tenant_id,
            "metric": "spend",
            "generation": 1,
            "period": "day",
            "quota": 100,
        }
    )
    day = period_index(Period.DAY, now)
    tier.exchange(now, K, day, "peer", 30)
    led = QuotaLedger("me")
    assert led.try_spend(now, p, 1).allowed
    at = led.tier_burn(K)
    assert at == (day, 0)  # unsynced: the hello writes 0 and learns our old field
    led.tier_folded(now, K, day, tier.exchange(now, K, day, "me", at[1]))
    led.folded(now, CellFold("o", 1, (FoldRow(K, day, 11, 1),)))  # the owner knows less
    lag = led.state(now, p)
    assert lag is not None and (lag.own, lag.remote) == (1, 30)
    assert sum(led.try_spend(now, p, 1).allowed for _ in range(100)) == 69
