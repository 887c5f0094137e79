"""The Redis client of a node's shared-state tier, and the redis-mode counter over it.

`redis_client(config)` builds a redis-py sync client whose every socket operation is
bounded by the 5 ms deadline (connect and read alike), with no retries (a retry would
wait; the core falls back instead) and at most CONNECTIONS_MAX connections (a caller that
finds none free within the deadline falls back too). Constructing it dials nothing: the
first operation opens the socket. The spend-quota tier takes the same client.

`RedisCounter` is the core's `Counter` over it: the GCRA script by EVALSHA (loaded on the
first NOSCRIPT, again after a server restart), each redis-py error translated into a
`CounterOutcome` at this one place, and the reply checked as untrusted input.
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
from redis import exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry

from mesh.config import RedisConfig
from mesh.core.admission import REDIS_DEADLINE_MS, CounterOutcome, CounterReply, parse_reply
from mesh.sharedstate._script import GCRA_LUA, GCRA_SHA

__all__ = ["CONNECTIONS_MAX", "ERROR_CHARS_MAX", "RedisCounter", "redis_client"]

CONNECTIONS_MAX = 64  # sockets one process holds to the tier (threads share them)
ERROR_CHARS_MAX = 200  # of an error's text kept for /health


def redis_client(config: RedisConfig, *, deadline_ms: int = REDIS_DEADLINE_MS) -> redis.Redis:
    """A lazy client for `config` (nothing dials until the first command)."""
    deadline_s = deadline_ms / 1000
    kwargs: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "password": config.password,
        "socket_timeout": deadline_s,
        "socket_connect_timeout": deadline_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "protocol": 2,  # RESP2: no HELLO round trip on connect
    }
    conn_class: type[redis.Connection] = redis.Connection
    if config.tls:
        conn_class = redis.SSLConnection  # the system's trust store, hostname checked
    params = inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    if "driver_info" in params:  # redis-py >= 7: no CLIENT SETINFO round trips on connect
        kwargs["driver_info"] = None
    elif "lib_name" in params:
        kwargs["lib_name"] = None
    pool = redis.BlockingConnectionPool(  # type: ignore[no-untyped-call]
        max_connections=CONNECTIONS_MAX,
        timeout=deadline_s,
        connection_class=conn_class,
        **kwargs,
    )
    return redis.Redis(connection_pool=pool)


class RedisCounter:
    """`mesh.core.admission.Counter` on a Redis client: one EVALSHA per step."""

    def __init__(self, client: redis.Redis, addr: str) -> None:
        self.client = client
        self.addr = addr
        self.loads = 0  # SCRIPT LOADs (the first step, and after a NOSCRIPT)

    @classmethod
    def from_config(cls, config: RedisConfig) -> RedisCounter:
        return cls(redis_client(config), config.addr)

    def step(self, key: str, rate: int, burst: int, amount: int) -> CounterReply:
        try:
            raw = self._eval(key, rate, burst, amount)
        except (rx.TimeoutError, TimeoutError) as exc:
            return _failed(CounterOutcome.DEADLINE_EXCEEDED, exc)
        except rx.ConnectionError as exc:
            if "No connection available" in str(exc):  # the pool's wait hit the deadline
                return _failed(CounterOutcome.DEADLINE_EXCEEDED, exc)
            return _failed(CounterOutcome.CONNECT_FAILED, exc)
        except rx.ResponseError as exc:  # a fatal reply on a live socket
            return _failed(CounterOutcome.EVAL_ERROR, exc)
        except rx.RedisError as exc:  # a reply the client could not parse
            return _failed(CounterOutcome.REPLY_MALFORMED, exc)
        except OSError as exc:
            return _failed(CounterOutcome.CONNECT_FAILED, exc)
        return parse_reply(raw, burst)

    def _eval(self, key: str, rate: int, burst: int, amount: int, *test_now_us: int) -> Any:
        args = (rate, burst, amount, *test_now_us)
        try:
            return self.client.evalsha(GCRA_SHA, 1, key, *args)
        except rx.NoScriptError:
            self.loads += 1
            self.client.script_load(GCRA_LUA)
            return self.client.evalsha(GCRA_SHA, 1, key, *args)

    def close(self) -> None:
        self.client.close()
        self.client.connection_pool.disconnect()


def _failed(outcome: CounterOutcome, exc: BaseException) -> CounterReply:
    text = f"{type(exc).__name__}: {exc}"
    return CounterReply(outcome, error=text[:ERROR_CHARS_MAX])
