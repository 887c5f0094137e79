"""mesh.sharedstate's client against real servers: lazy, EVALSHA with a reload after
NOSCRIPT, every failure an outcome (never an exception), the deadline on every call."""

from __future__ import annotations

import socket
import time

import redis

from bench._procs import free_port
from mesh.config import RedisConfig
from mesh.core.admission import CounterOutcome
from mesh.sharedstate import RedisCounter
from tests.mesh.sharedstate._redis import SHARED, unique


def test_constructing_dials_nothing() -> None:
    with socket.socket() as listener:  # accepts nothing: a dial would show in its backlog
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        counter = RedisCounter.from_config(RedisConfig(f"127.0.0.1:{port}"))
        listener.settimeout(0.2)
        try:
            listener.accept()
            dialled = True
        except TimeoutError:
            dialled = False
        assert not dialled
        counter.close()


def test_nothing_listening_is_connect_failed() -> None:
    counter = RedisCounter.from_config(RedisConfig(f"127.0.0.1:{free_port()}"))
    reply = counter.step("rm:gcra:x", 10, 10, 1)
    assert reply.outcome is CounterOutcome.CONNECT_FAILED and reply.error
    counter.close()


def test_a_silent_server_is_deadline_exceeded() -> None:
    with socket.socket() as listener:  # the kernel accepts; nobody answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        counter = RedisCounter.from_config(RedisConfig(f"127.0.0.1:{listener.getsockname()[1]}"))
        t0 = time.monotonic()
        reply = counter.step("rm:gcra:x", 10, 10, 1)
        took = time.monotonic() - t0
        assert reply.outcome is CounterOutcome.DEADLINE_EXCEEDED
        assert took < 1.0  # bounded by the deadline, not by a default timeout
        counter.close()


def test_a_fatal_reply_on_a_live_socket_is_eval_error(shared_redis: redis.Redis) -> None:
    counter = RedisCounter.from_config(RedisConfig(SHARED))
    key = unique("rm:test:wrongtype")
    try:
        shared_redis.rpush(key, "x")  # GET on a list: WRONGTYPE inside the script
        reply = counter.step(key, 10, 10, 1)
        assert reply.outcome is CounterOutcome.EVAL_ERROR
        assert "WRONGTYPE" in reply.error
    finally:
        shared_redis.delete(key)
        counter.close()
