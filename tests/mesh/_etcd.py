"""A real etcd server for a test: free loopback ports, a temp data dir, stopped after."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx

from bench._procs import free_port
from tests.mesh._util import require_binary

__all__ = ["EtcdServer", "require_etcd"]


def require_etcd() -> str:
    return require_binary("etcd", "etcd-server")


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        self.binary = require_etcd()
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"etcd-{self.client_port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--name",
                    "t",
                    "--data-dir",
                    str(self.data_dir),
                    "--listen-client-urls",
                    self.url,
                    "--advertise-client-urls",
                    self.url,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"t={peer}",
                ],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not start: {self.log.read_text()[-2000:]}")

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.proc.wait(20)
        self.proc = None
