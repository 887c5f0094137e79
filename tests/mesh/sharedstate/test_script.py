"""The Lua script is `gcra_step`, line for line: the same answers and the same stored TAT
for the same state and instant, on random inputs (the script's test-only clock argument
stands in for the server's `TIME`). Against the real Redis on 127.0.0.1:6379."""

from __future__ import annotations

import random

import redis

from mesh.core.admission import parse_reply
from mesh.core.admission._counter import NUMBER_MAX, GcraState, gcra_step
from mesh.sharedstate import GCRA_LUA, GCRA_SHA
from tests.mesh.sharedstate._redis import unique

SEED = 20261202


def _state(held: bytes | None) -> GcraState | None:
    if held is None:
        return None
    tat_us, rem = held.decode().split(":")
    return GcraState(int(tat_us), int(rem))


def test_the_script_is_gcra_step(shared_redis: redis.Redis) -> None:
    rng = random.Random(SEED)
    shared_redis.script_load(GCRA_LUA)
    prefix = unique("rm:test:pin")
    for trial in range(150):
        key = f"{prefix}:{trial}"
        rate = rng.choice([1, 3, 7, 1000, 999_983, NUMBER_MAX, rng.randint(1, NUMBER_MAX)])
        burst = rng.choice([1, 5, 100, NUMBER_MAX, rng.randint(1, NUMBER_MAX)])
        now_us = 1_764_000_000_000_000 + rng.randint(0, 10**9)
        held: bytes | None = None
        for step in range(20):
            now_us += rng.choice([0, 1, 7, 333, 10**6, rng.randint(0, 10**7)])
            amount = rng.randint(1, burst)
            new, want = gcra_step(_state(held), now_us, rate, burst, amount)
            # One transaction: the key is as the model has it, and cannot expire (PX is
            # real time, the instant here is not) between the step and the read-back.
            p = shared_redis.pipeline(transaction=True)
            if held is None:
                p.delete(key)
            else:
                p.set(key, held)
            p.evalsha(GCRA_SHA, 1, key, rate, burst, amount, now_us)
            p.persist(key)
            p.get(key)
            *_, raw, _, after = p.execute()
            where = f"seed {SEED} trial {trial} step {step}: rate {rate} burst {burst}"
            assert parse_reply(raw, burst) == want, where
            if new is None:
                assert after == held, where
            else:
                assert after == f"{new.tat_us}:{new.rem}".encode(), where
            held = after
        shared_redis.delete(key)
