"""A governord subprocess for the scenario benchmarks: a temp config, a loopback port, kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml

from ratemesh.ports import free_port

__all__ = ["KEYS", "Governord"]

KEYS = {"BENCH_KEY_A": "bench-key-of-tenant-a-5e3b", "BENCH_KEY_B": "bench-key-of-tenant-b-9c7d"}


class Governord:
    """``with Governord(store, root_limits=..., adaptive=...) as g: g.addr``."""

    def __init__(
        self,
        store: str = "sqlite",
        *,
        dsn: str | None = None,
        schema: str | None = None,
        **config: Any,
    ) -> None:
        """``schema``: a PostgreSQL schema several processes share (leader and standbys); the
        caller then drops it (``__exit__`` drops only a schema of this process's own)."""
        self._dir = tempfile.TemporaryDirectory(prefix="governord-scenario-")
        where = Path(self._dir.name)
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.shared = schema is not None
        self.schema = schema or f"governor_scen_{os.getpid()}_{self.port}"
        self.dsn = dsn
        target = {"sqlite": f"sqlite:{where / 'governor.db'}", "memory": "memory:"}.get(
            store, dsn or ""
        )
        cfg: dict[str, Any] = {
            "listen": self.addr,
            "store": target,
            "drain_s": 0.5,
            "session": {"ttl_ms": 10_000, "min_ttl_ms": 100},
            "snapshot_every": 50_000,
            "tenants": {
                "a": {"api_key_env": "BENCH_KEY_A"},
                "b": {"api_key_env": "BENCH_KEY_B"},
            },
        }
        cfg.update(config)
        self.config_path = where / "governord.yaml"
        self.stderr_path = where / "governord.stderr"  # appended to by every start
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.store = store
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **KEYS, "GOVERNOR_PG_SCHEMA": self.schema}
        err = open(self.stderr_path, "ab")  # noqa: SIM115 - handed to the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "governor.cli", "--config", str(self.config_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
        err.close()
        assert self.proc.stdout is not None
        timer = threading.Timer(60, self.proc.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline().decode()
        finally:
            timer.cancel()
        if not line.startswith("LISTENING"):
            raise RuntimeError(f"governord did not start ({self.store})")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def __enter__(self) -> Governord:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self.store == "postgres" and self.dsn and not self.shared:
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')  # type: ignore[arg-type]
        self._dir.cleanup()
