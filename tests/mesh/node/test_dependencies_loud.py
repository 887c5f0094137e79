"""A node says when what it depends on fails, and when it answers again: a real `mesh node`
process against a real governord (the coordinator) on loopback, with a wrong key and with no
coordinator at the address. Each failure is a JSON log line, the dependency's gauge at 0 and
a /health reason, all before the node says it serves; readiness waits for policies."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench._procs import read_ready, stop
from mesh.core.policy import Metric, RateKey
from mesh.core.verdict import Reason
from mesh.node import Mesh
from mesh.peer import CoordinatorClient
from ratemesh import logs
from tests.governor._daemon import Daemon, free_port
from tests.governor._stores import make_target
from tests.mesh._util import POLICY, http_get, static_nodes, wait_for

pytestmark = pytest.mark.slow

WORKER_KEY = "worker-key-of-the-mesh-nodes"
ADMIN_KEY = "coordinator-key-of-the-deploy-bot"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _governord(tmp: Path, port: int | None = None) -> Iterator[Daemon]:
    for store in make_target("sqlite", tmp):
        keys = {
            "deploy": {"api_key_sha256": _sha(ADMIN_KEY), "scope": "coordinator"},
            "workers": {"api_key_sha256": _sha(WORKER_KEY), "scope": "worker"},
        }
        d = Daemon(tmp, store, coordinator={"keys": keys})
        if port is not None:
            d.port, d.addr = port, f"127.0.0.1:{port}"
            d.config["listen"] = d.addr
        d.start()
        try:
            yield d
        finally:
            d.close()


def _coordinator(addr: str) -> dict[str, Any]:
    """A node's `policies:` from the coordinator at `addr` alone, polled every 200 ms."""
    return {"coordinator": {"addr": addr, "poll_ttl_ms": 200, "api_key_env": "T_KEY"}}


class Node:
    """`mesh node` with the config `sections` given (a coordinator, strict), the key in T_KEY;
    stderr to a file."""

    def __init__(self, tmp: Path, key: str, **sections: Any) -> None:
        (cfg,) = static_nodes(["solo"], telemetry_listen="127.0.0.1:0")
        cfg.update(sections)
        path = tmp / "node.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.err_path = tmp / "node.stderr"
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mesh.cli", "node", "--config", str(path)],
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=dict(os.environ, T_KEY=key, PYTHONHASHSEED="0"),
        )
        self.ready = read_ready(self.proc)
        self.tel = self.ready["telemetry"]

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.err_path.read_text().splitlines() if line]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == name]

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = http_get(self.tel, "/health").json()
        return out

    def gauge(self) -> str:
        text = http_get(self.tel, "/metrics").text
        return next(
            (ln for ln in text.splitlines() if ln.startswith("ratemesh_dependency_up{")), ""
        )

    def close(self) -> None:
        stop(self.proc)
        self.err.close()


def test_a_wrong_coordinator_key_is_a_log_line_a_gauge_and_a_reason_before_serving(
    tmp_path: Path,
) -> None:
    for gov in _governord(tmp_path):
        node = Node(tmp_path, "not-the-worker-key", policies=_coordinator(gov.addr))
        try:
            # said before the node printed its address: the probe runs before "serving"
            (down,) = node.named("dependency_down")
            assert down["dependency"] == "coordinator" and down["level"] == "warning", down
            assert "UNAUTHENTICATED" in down["reason"] or "key" in down["reason"], down
            assert {"ts", "level", "logger", "event", "msg"} <= down.keys()
            assert node.gauge() == 'ratemesh_dependency_up{dependency="coordinator"} 0.0'
            h = node.health()
            assert [d["dependency"] for d in h["degraded"]] == ["coordinator"], h["degraded"]
            assert h["ready"] is False and h["not_ready"], h["not_ready"]
            assert http_get(node.tel, "/health/ready").status_code == 503
            assert http_get(node.tel, "/health/live").status_code == 200
            # asked again every 200 ms (list, then watch) and refused each time: not said again
            time.sleep(1.0)
            coordinator = node.health()["policies"]["coordinator"]
            assert coordinator["last_error"] and not coordinator["reachable"], coordinator
            assert len(node.named("dependency_down")) == 1, node.events()
        finally:
            node.close()
        shutdown = [e["event"] for e in node.events() if e["event"].startswith("shutdown")]
        assert shutdown[0] == "shutdown_started" and shutdown[-1] == "shutdown_done", shutdown


def test_an_unreachable_coordinator_is_said_and_so_is_its_return(tmp_path: Path) -> None:
    port = free_port()
    node = Node(tmp_path, WORKER_KEY, policies=_coordinator(f"127.0.0.1:{port}"))
    try:
        (down,) = node.named("dependency_down")
        assert down["dependency"] == "coordinator" and down["addr"] == f"127.0.0.1:{port}"
        assert node.health()["not_ready"], "no policies and no coordinator: not ready"
        assert http_get(node.tel, "/health/ready").status_code == 503
        for gov in _governord(tmp_path, port):

            async def put(addr: str = gov.addr) -> None:
                c = CoordinatorClient(addr, api_key=ADMIN_KEY, timeout_s=10)
                try:
                    await c.put(POLICY)
                finally:
                    await c.close()

            asyncio.run(put())
            wait_for(lambda: bool(node.named("dependency_up")), 20, "the recovery line")
            (up,) = node.named("dependency_up")
            assert up["dependency"] == "coordinator" and up["down_s"] > 0, up
            assert node.gauge() == 'ratemesh_dependency_up{dependency="coordinator"} 1.0'
            wait_for(lambda: http_get(node.tel, "/health/ready").status_code == 200, 10, "ready")
            assert node.health()["degraded"] == []
    finally:
        node.close()


def test_a_strict_governord_that_refuses_the_key_is_said_before_serving(tmp_path: Path) -> None:
    for gov in _governord(tmp_path):
        strict = {"governord": gov.addr, "api_key_env": "T_KEY"}
        node = Node(tmp_path, "not-a-tenant-key", strict=strict)
        try:
            (down,) = node.named("dependency_down")
            assert down["dependency"] == "governord" and down["addr"] == gov.addr, down
            assert "UNAUTHENTICATED" in down["reason"], down
            assert node.gauge() == 'ratemesh_dependency_up{dependency="governord"} 0.0'
            assert [d["dependency"] for d in node.health()["degraded"]] == ["governord"]
        finally:
            node.close()


def test_a_frozen_owner_is_one_line_not_one_per_denial(tmp_path: Path) -> None:
    policies = [dict(POLICY, tenant_id=f"t{i}") for i in range(16)]
    cfg_a, cfg_b = static_nodes(["a", "b"], policies, telemetry_listen="127.0.0.1:0")
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(cfg_b))
    b = subprocess.Popen(
        [sys.executable, "-m", "mesh.cli", "node", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    handler = Said()
    said = handler.records
    logging.getLogger("mesh.node").addHandler(handler)
    a = Mesh(cfg_a).start()
    try:
        read_ready(b)
        wait_for(lambda: len(a.ring) == 2, 10, "b in a's ring")
        theirs = [p["tenant_id"] for p in policies if a.ring.owner_of(_key(p)) == "b"]
        assert theirs, "b owns some of 16 keys"
        b.send_signal(signal.SIGSTOP)
        denied = 0
        deadline = time.monotonic() + 20
        while not any(getattr(r, logs.EVENT, "") == "dependency_down" for r in said):
            assert time.monotonic() < deadline, "no line for the frozen owner"
            for tenant in theirs:
                denied += a.try_admit(tenant, "read_iops").reason is Reason.OWNER_UNREACHABLE
            time.sleep(0.01)
        for _ in range(200):  # more denials: no more lines
            for tenant in theirs:
                denied += a.try_admit(tenant, "read_iops").reason is Reason.OWNER_UNREACHABLE
            time.sleep(0.005)
        down = [r for r in said if getattr(r, logs.EVENT, "") == "dependency_down"]
        assert len(down) == 1 and denied > 1, (denied, [r.getMessage() for r in down])
        assert "owner_unreachable: b" in down[0].getMessage()
        assert [d["dependency"] for d in a.health()["degraded"]] == ["owners"]
        b.send_signal(signal.SIGCONT)
        wait_for(lambda: a.health()["degraded"] == [], 20, "the owner answers again")
    finally:
        a.stop()
        logging.getLogger("mesh.node").removeHandler(handler)
        b.send_signal(signal.SIGCONT)
        stop(b)


class Said(logging.Handler):
    """The records logged in this process (the in-process node's lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _key(policy: dict[str, Any]) -> RateKey:
    return RateKey(policy["tenant_id"], Metric.READ_IOPS, policy["generation"])
