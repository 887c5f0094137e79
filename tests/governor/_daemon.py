"""A real governord process for end-to-end tests: config in a temp dir, a fixed loopback port
(so a restart comes back on the same address), SIGKILL and SIGSTOP on demand, raw calls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from governor import wire
from ratemesh.ports import free_port as free_port  # the tests import it from here
from tests.governor._stores import StoreTarget, make_target

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"KEY_A": "key-of-tenant-a-4f1c9e", "KEY_B": "key-of-tenant-b-8d2a7b"}


def base_config(store: StoreTarget, port: int, **extra: Any) -> dict[str, Any]:
    target = f"sqlite:{store.target}" if store.kind == "sqlite" else store.target
    cfg: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "store": target,
        "drain_s": 1,
        "session": {"ttl_ms": 5000, "min_ttl_ms": 100},
        "root": {"limits": {"db": 4}},
        "tenants": {
            "a": {"api_key_env": "KEY_A", "quotas": {"http": 1000}},
            "b": {"api_key_env": "KEY_B", "weight": 1},
        },
    }
    cfg.update(extra)
    return cfg


class Daemon:
    def __init__(self, tmp: Path, store: StoreTarget, **extra: Any) -> None:
        self.tmp = tmp
        self.store = store
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.config = base_config(store, self.port, **extra)
        self.config_path = tmp / "governord.yaml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path = tmp / "governord.stderr"
        self.starts = 0
        self.args: list[str] = []  # more governord flags (--log-level DEBUG)
        self.extra_env: dict[str, str] = {}  # GOVERNOR_PLANT_BUG, ...
        self.argv_prefix: list[str] = []  # run it inside something: ip netns exec NAME

    def env(self) -> dict[str, str]:
        env = {**os.environ, **KEYS, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
        if self.store.kind == "postgres":
            env["GOVERNOR_PG_SCHEMA"] = self.store.schema
            env["GOVERNOR_PG_APP_NAME"] = f"governord-{self.store.schema}"
        return {**env, **self.extra_env}

    def start(self, timeout_s: float = 30.0) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))
        err = open(self.stderr_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [
                *self.argv_prefix,
                sys.executable,
                "-m",
                "governor.cli",
                "--config",
                str(self.config_path),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            env=self.env(),
        )
        err.close()
        self.starts += 1
        assert self.proc.stdout is not None
        done = threading.Event()
        killer = threading.Timer(timeout_s, lambda: done.is_set() or self.proc.kill())  # type: ignore[union-attr]
        killer.start()
        try:
            line = self.proc.stdout.readline().decode()
        finally:
            done.set()
            killer.cancel()
        if not line.startswith("LISTENING"):
            raise AssertionError(f"governord did not start: {line!r}\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


class Raw:
    """Blocking raw calls: bytes or maps in, (reply | None, code, detail) out."""

    def __init__(self, addr: str) -> None:
        self.channel = grpc.insecure_channel(addr)

    def __call__(
        self,
        method: str,
        body: dict[str, Any] | bytes,
        *,
        key: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> tuple[dict[str, Any] | None, grpc.StatusCode, dict[str, Any]]:
        md = []
        if key is not None:
            md.append((wire.KEY_MD, key))
        if token is not None:
            md.append((wire.TOKEN_MD, token))
        data = body if isinstance(body, bytes) else wire.pack({"v": 1, **body})
        fn = self.channel.unary_unary(wire.path(method))
        try:
            return wire.unpack(fn(data, metadata=md, timeout=timeout)), grpc.StatusCode.OK, {}
        except grpc.RpcError as e:
            detail: dict[str, Any] = {}
            for k, v in e.trailing_metadata() or ():
                if k == wire.ERROR_MD:
                    detail = wire.unpack(v)
            return None, e.code(), detail

    def ok(self, method: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        reply, code, detail = self(method, body, **kw)
        assert code is grpc.StatusCode.OK, (method, code, detail)
        assert reply is not None
        return reply

    def session(self, key: str, ttl_ms: int = 5000) -> str:
        return str(self.ok("OpenSession", {"ttl_ms": ttl_ms}, key=key)["token"])

    def close(self) -> None:
        self.channel.close()


def running(kind: str, tmp_path: Path) -> Iterator[Daemon]:
    """A started governord on a fresh store of `kind`, closed afterwards (for fixtures)."""
    for store in make_target(kind, tmp_path):
        d = Daemon(tmp_path, store)
        d.start()
        try:
            yield d
        finally:
            d.close()


def wait_until(pred: Any, timeout_s: float = 10.0, step_s: float = 0.01) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step_s)
    return bool(pred())


# Fixtures shared by the end-to-end modules (imported there by name).
KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    yield from running(request.param, tmp_path)


@pytest.fixture
def sqlite_daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


@pytest.fixture
def raw(daemon: Daemon) -> Iterator[Raw]:
    r = Raw(daemon.addr)
    yield r
    r.close()
